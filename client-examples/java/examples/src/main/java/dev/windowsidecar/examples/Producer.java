package dev.windowsidecar.examples;

import dev.windowsidecar.client.WindowClient;
import dev.windowsidecar.client.WindowClient.Message;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletionException;

/**
 * Publishes the order set of orders.json to the {@code orders} stream through the sidecar's
 * Publish RPC: one entry per order, payload = the order JSON, all in one call.
 *
 * <p>Flags: {@code --addr host:port} or {@code unix:PATH} (env WINDOW_SIDECAR_ADDR, default
 * 127.0.0.1:50051), {@code --orders path} (default ../orders.json), {@code --stream key}
 * (default: the file's). A sidecar started with {@code --auth-token-file} needs the token in
 * WINDOW_SIDECAR_TOKEN.
 */
public final class Producer {
  private Producer() {}

  public static void main(String[] argv) throws Exception {
    Args args = new Args(argv);
    String addr = args.get("addr", Args.env("WINDOW_SIDECAR_ADDR", "127.0.0.1:50051"));
    Orders.File file = Orders.load(Path.of(args.get("orders", "../orders.json")));
    String stream = args.get("stream", file.stream());
    args.done();

    List<Message> messages = new ArrayList<>();
    for (String payload : file.payloads()) {
      Orders.Order o = Orders.parse(payload);
      messages.add(
          Message.of(payload, Map.of("content-type", "application/json", "order-id", o.id)));
    }
    try (WindowClient client = WindowClient.connect(addr)) {
      List<String> ids;
      try {
        ids = client.publish(stream, messages).join();
      } catch (CompletionException e) {
        System.err.println("publish failed: " + e.getCause());
        System.exit(1);
        return;
      }
      if (ids.isEmpty()) {
        System.out.printf("published no orders to \"%s\"%n", stream);
      } else {
        System.out.printf(
            "published %d orders to \"%s\": %s .. %s%n",
            ids.size(), stream, ids.get(0), ids.get(ids.size() - 1));
      }
    }
  }
}
