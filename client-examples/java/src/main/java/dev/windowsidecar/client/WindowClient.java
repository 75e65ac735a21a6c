package dev.windowsidecar.client;

import com.google.protobuf.ByteString;
import dev.windowsidecar.v1.PublishEntry;
import dev.windowsidecar.v1.PublishRequest;
import dev.windowsidecar.v1.PublishResponse;
import dev.windowsidecar.v1.WindowServiceGrpc;
import io.grpc.Channel;
import io.grpc.ClientInterceptors;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.stub.MetadataUtils;
import io.grpc.stub.StreamObserver;
import io.netty.channel.EventLoopGroup;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
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
 *
 * <p>{@code connect("unix:/run/window-sidecar/grpc.sock")} reaches a sidecar on its Unix socket
 * ({@code --listen unix:PATH}) through Netty's epoll transport, whose native library must be on
 * {@code java.library.path} (see {@code native-epoll.sh}).
 *
 * <p>A sidecar started with {@code --auth-token-file} wants every call to carry its bearer token:
 * {@link #connect(String)} sends the one in the environment variable {@value #TOKEN_ENV} when it is
 * set, as {@code authorization: Bearer <token>}.
 */
public final class WindowClient implements AutoCloseable {
  /** The environment variable {@link #connect(String)} takes the bearer token from. */
  public static final String TOKEN_ENV = "WINDOW_SIDECAR_TOKEN";

  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private final ManagedChannel channel;
  private final boolean owned;
  /** The event loop of a Unix socket channel, shut down after it; else null. */
  private final EventLoopGroup group;
  final WindowServiceGrpc.WindowServiceStub async;

  private WindowClient(ManagedChannel channel, boolean owned, EventLoopGroup group, String token) {
    this.channel = channel;
    this.owned = owned;
    this.group = group;
    Channel calls = channel;
    if (token != null && !token.isEmpty()) {
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, "Bearer " + token);
      calls = ClientInterceptors.intercept(channel, MetadataUtils.newAttachHeadersInterceptor(headers));
    }
    this.async = WindowServiceGrpc.newStub(calls);
  }

  /**
   * Connects in plaintext to {@code host:port} (a sidecar listens on the pod's loopback), or to
   * the Unix socket of {@code unix:PATH} / {@code unix:///PATH}, the target syntax of newer
   * grpc-java (1.41 has no {@code unix:} name resolver).
   */
  public static WindowClient connect(String target) {
    return connect(target, System.getenv(TOKEN_ENV));
  }

  /** {@link #connect(String)} with this bearer token (null or empty: none). */
  public static WindowClient connect(String target, String token) {
    String path = unixSocketPath(target);
    if (path == null) {
      ManagedChannel channel = ManagedChannelBuilder.forTarget(target).usePlaintext().build();
      return new WindowClient(channel, true, null, token);
    }
    return connectUnix(path, token);
  }

  /** Uses a channel the caller owns ({@link #close} leaves it open), with no token. */
  public static WindowClient of(ManagedChannel channel) {
    return of(channel, null);
  }

  /** Uses a channel the caller owns, every call carrying this bearer token. */
  public static WindowClient of(ManagedChannel channel, String token) {
    return new WindowClient(channel, false, null, token);
  }

  /**
   * The socket path of a {@code unix:PATH} or {@code unix:///PATH} target (grpc's naming: no
   * authority after {@code unix://}), null for any other target.
   */
  static String unixSocketPath(String target) {
    if (!target.startsWith("unix:")) {
      return null;
    }
    String path = target.substring("unix:".length());
    if (path.startsWith("//")) {
      if (!path.startsWith("///")) {
        throw new IllegalArgumentException(
            "a unix target has no authority: unix:PATH or unix:///PATH, not " + target);
      }
      path = path.substring(2);
    }
    if (path.isEmpty()) {
      throw new IllegalArgumentException("a unix target names a socket path: " + target);
    }
    return path;
  }

  /** A channel to a Unix socket; NoClassDefFoundError means the optional epoll jar is missing. */
  private static WindowClient connectUnix(String path, String token) {
    UnixSockets.Connection c;
    try {
      c = UnixSockets.connect(path);
    } catch (NoClassDefFoundError e) {
      throw new IllegalStateException(
          "unix:" + path + " needs io.netty:netty-transport-native-epoll on the classpath", e);
    }
    return new WindowClient(c.channel(), true, c.group(), token);
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

  /**
   * Appends the messages to a stream in one call. The future completes with the ids Redis gave
   * them, or with the call's {@link io.grpc.StatusRuntimeException} (for example UNAUTHENTICATED
   * without the sidecar's token). Asynchronous, so that a producer can keep publishing while
   * earlier calls are in flight; {@code join()} it to wait. Deadline: 30 s.
   */
  public CompletableFuture<List<String>> publish(String stream, List<Message> messages) {
    PublishRequest.Builder req = PublishRequest.newBuilder().setStream(stream);
    for (Message m : messages) {
      PublishEntry.Builder e = PublishEntry.newBuilder().setPayload(m.payload());
      if (m.headers() != null) {
        e.putAllHeaders(m.headers());
      }
      req.addEntries(e);
    }
    CompletableFuture<List<String>> ids = new CompletableFuture<>();
    async
        .withDeadlineAfter(30, TimeUnit.SECONDS)
        .publish(
            req.build(),
            new StreamObserver<PublishResponse>() {
              @Override
              public void onNext(PublishResponse r) {
                ids.complete(r.getIdsList());
              }

              @Override
              public void onError(Throwable t) {
                ids.completeExceptionally(t);
              }

              @Override
              public void onCompleted() {
                ids.complete(List.of()); // no-op after onNext
              }
            });
    return ids;
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
    } finally {
      if (group != null) {
        // The channel does not own an event loop it was given.
        group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
      }
    }
  }
}
