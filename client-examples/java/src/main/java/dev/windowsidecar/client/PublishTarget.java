package dev.windowsidecar.client;

import java.util.Objects;

/**
 * Where {@link WindowClient#publish(PublishTarget, java.util.List)} puts its entries: a stream
 * (XADD), a list (LPUSH, where list subscriptions read), a channel (PUBLISH) or a sharded channel
 * (SPUBLISH, Redis 7).
 *
 * @param kind which of the four
 * @param name the stream or list key, or the channel
 * @param maxLen streams: trims the stream to about this many entries (XADD MAXLEN ~); 0: no trim
 * @param raw lists and channels: the payload is written alone, as it is ({@code FRAMING_RAW}:
 *     headers are refused); false: a frame when the entry has headers or a trace context
 */
public record PublishTarget(Kind kind, String name, long maxLen, boolean raw) {
  /** The four kinds of target. */
  public enum Kind {
    STREAM,
    LIST,
    CHANNEL,
    SHARDED_CHANNEL
  }

  public PublishTarget {
    Objects.requireNonNull(kind, "kind");
    if (name == null || name.isEmpty()) {
      throw new IllegalArgumentException("a publish target needs a key or a channel");
    }
    if (maxLen < 0 || (maxLen > 0 && kind != Kind.STREAM)) {
      throw new IllegalArgumentException("maxLen is a positive length, for a stream only");
    }
    if (raw && kind == Kind.STREAM) {
      throw new IllegalArgumentException("raw values are for lists and channels");
    }
  }

  /** A stream key: entries are appended with XADD, payload as {@code _payload}, headers as {@code h:<name>}. */
  public static PublishTarget stream(String key) {
    return new PublishTarget(Kind.STREAM, key, 0, false);
  }

  /** A list key: each entry's value is pushed with LPUSH (a frame when it has headers). */
  public static PublishTarget list(String key) {
    return new PublishTarget(Kind.LIST, key, 0, false);
  }

  /** A channel: each entry's value is published with PUBLISH (a frame when it has headers). */
  public static PublishTarget channel(String channel) {
    return new PublishTarget(Kind.CHANNEL, channel, 0, false);
  }

  /** A sharded channel: each entry's value is published with SPUBLISH. */
  public static PublishTarget shardedChannel(String channel) {
    return new PublishTarget(Kind.SHARDED_CHANNEL, channel, 0, false);
  }

  /** This stream target, trimmed to about {@code maxLen} entries by every publish. */
  public PublishTarget withMaxLen(long maxLen) {
    return new PublishTarget(kind, name, maxLen, raw);
  }

  /** This list or channel target, writing each payload alone and as it is (no frame). */
  public PublishTarget withRawValues() {
    return new PublishTarget(kind, name, maxLen, true);
  }
}
