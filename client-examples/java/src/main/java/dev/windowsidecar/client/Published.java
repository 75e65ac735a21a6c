package dev.windowsidecar.client;

import java.util.List;

/**
 * What a publish did.
 *
 * @param ids streams: the ids Redis gave the entries, in order (empty for other targets)
 * @param receivers channels: how many subscribers received each entry, in order (empty for
 *     other targets)
 */
public record Published(List<String> ids, List<Long> receivers) {
  public Published {
    ids = List.copyOf(ids);
    receivers = List.copyOf(receivers);
  }
}
