package dev.windowsidecar.client;

import com.google.protobuf.ByteString;
import dev.windowsidecar.v1.PublishEntry;
import dev.windowsidecar.v1.PublishRequest;
import dev.windowsidecar.v1.WindowServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A connection to one window-sidecar: {@link #publish} entries, {@link #subscribe} to a stream.
 *
 * <pre>{@code
 * try (WindowClient client = WindowClient.connect("127.0.0.1:50051");
 *      Subscription sub = client.subscribe(
 *          SubscribeOptions.builder("orders", "order-service").consumer("worker-1").count(16).build(),
 *          d -> { d.queue("INCR", "seen"); d.ack(); })) {
 *   sub.awaitTermination();
 * }
 * }</pre>
 */
public final class WindowClient implements AutoCloseable {
  private final ManagedChannel channel;
  private final boolean owned;
  final WindowServiceGrpc.WindowServiceStub async;
  private final WindowServiceGrpc.WindowServiceBlockingStub blocking;

  private WindowClient(ManagedChannel channel, boolean owned) {
    this.channel = channel;
    this.owned = owned;
    this.async = WindowServiceGrpc.newStub(channel);
    this.blocking = WindowServiceGrpc.newBlockingStub(channel);
  }

  /** Connects in plaintext to {@code host:port} (a sidecar listens on the pod's loopback). */
  public static WindowClient connect(String target) {
    return new WindowClient(ManagedChannelBuilder.forTarget(target).usePlaintext().build(), true);
  }

  /** Uses a channel the caller owns ({@link #close} leaves it open). */
  public static WindowClient of(ManagedChannel channel) {
    return new WindowClient(channel, false);
  }

  /** The generated asynchronous stub, for anything this helper does not cover. */
  public WindowServiceGrpc.WindowServiceStub stub() {
    return async;
  }

  /** One entry to publish: a payload and headers (written as {@code _payload} and {@code h:<name>}). */
  public record Message(ByteString payload, Map<String, String> headers) {
    public static Message of(String payload, Map<String, String> headers) {
      return new Message(ByteString.copyFromUtf8(payload), headers);
    }
  }

  /** Appends the messages to a stream in one call; returns the ids Redis gave them. */
  public List<String> publish(String stream, List<Message> messages) {
    PublishRequest.Builder req = PublishRequest.newBuilder().setStream(stream);
    for (Message m : messages) {
      PublishEntry.Builder e = PublishEntry.newBuilder().setPayload(m.payload());
      if (m.headers() != null) {
        e.putAllHeaders(m.headers());
      }
      req.addEntries(e);
    }
    return blocking.withDeadlineAfter(30, TimeUnit.SECONDS).publish(req.build()).getIdsList();
  }

  /**
   * Starts a subscription: {@code handler} is called for every delivery, one at a time, on the
   * subscription's own thread. Connecting and reconnecting happen in the background.
   */
  public Subscription subscribe(SubscribeOptions options, DeliveryHandler handler) {
    Subscription sub = new Subscription(this, options, handler);
    sub.start();
    return sub;
  }

  @Override
  public void close() {
    if (!owned) {
      return;
    }
    channel.shutdown();
    try {
      if (!channel.awaitTermination(5, TimeUnit.SECONDS)) {
        channel.shutdownNow();
      }
    } catch (InterruptedException e) {
      channel.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }
}
