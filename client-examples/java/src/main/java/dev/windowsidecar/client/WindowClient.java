package dev.windowsidecar.client;

import com.google.protobuf.ByteString;
import dev.windowsidecar.v1.Framing;
import dev.windowsidecar.v1.PublishEntry;
import dev.windowsidecar.v1.PublishRequest;
import dev.windowsidecar.v1.PublishResponse;
import dev.windowsidecar.v1.TraceContext;
import dev.windowsidecar.v1.WindowServiceGrpc;
import io.grpc.Channel;
import io.grpc.ClientInterceptors;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.MetadataUtils;
import io.grpc.stub.StreamObserver;
import io.netty.channel.EventLoopGroup;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * A connection to one window-sidecar: {@link #publish} entries, {@link #subscribe} to a stream, a
 * list or pub/sub.
 *
 * <pre>{@code
 * try (WindowClient client = WindowClient.connect();   // WINDOW_SIDECAR_ADDR, _TOKEN, _TLS_*
 *      Subscription sub = client.subscribe(
 *          SubscribeOptions.builder("orders", "order-service").consumer("worker-1").count(16).build(),
 *          d -> { d.queue("INCR", "seen"); d.ack(); })) {
 *   sub.awaitTermination();
 * }
 * }</pre>
 *
 * <p>Like a deployed worker, {@link #connect()} takes everything from the environment: the target
 * from {@value #ADDR_ENV} ({@code host:port} or {@code unix:PATH}; default {@value
 * #DEFAULT_TARGET}), the bearer token from {@value #TOKEN_ENV} (sent as {@code authorization:
 * Bearer <token>} on every call), and TLS from {@value #TLS_CA_ENV} (a PEM CA: when set the
 * channel uses TLS and verifies the sidecar against it), {@value #TLS_CERT_ENV} and {@value
 * #TLS_KEY_ENV} (a PEM client certificate and its key, for mutual TLS) and {@value
 * #TLS_SERVER_NAME_ENV} (the name to verify instead of the target's host). What {@link
 * #builder()} is given in code wins over the environment.
 *
 * <p>{@code unix:/run/window-sidecar/grpc.sock} reaches a sidecar on its Unix socket ({@code
 * --listen unix:PATH}) through Netty's epoll transport, whose native library must be on {@code
 * java.library.path} (see {@code native-epoll.sh}).
 */
public final class WindowClient implements AutoCloseable {
  /** The environment variable of the sidecar's address. */
  public static final String ADDR_ENV = "WINDOW_SIDECAR_ADDR";
  /** The target when neither the code nor {@value #ADDR_ENV} names one. */
  public static final String DEFAULT_TARGET = "127.0.0.1:50051";
  /** The environment variable of the bearer token. */
  public static final String TOKEN_ENV = "WINDOW_SIDECAR_TOKEN";
  /** The environment variable of the PEM CA file; when set, the channel uses TLS. */
  public static final String TLS_CA_ENV = "WINDOW_SIDECAR_TLS_CA";
  /** The environment variable of the PEM client certificate (mutual TLS). */
  public static final String TLS_CERT_ENV = "WINDOW_SIDECAR_TLS_CERT";
  /** The environment variable of the PEM client key (mutual TLS, PKCS#8). */
  public static final String TLS_KEY_ENV = "WINDOW_SIDECAR_TLS_KEY";
  /** The environment variable of the name to verify the sidecar's certificate for. */
  public static final String TLS_SERVER_NAME_ENV = "WINDOW_SIDECAR_TLS_SERVER_NAME";

  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  /**
   * The deadline of a publish: longer than the sidecar's {@code --redis-timeout} (5 s by default),
   * within which the sidecar answers even when Redis does not, so that its own answer (a {@link
   * RedisUnavailableException}) arrives rather than a deadline of the client's.
   */
  public static final long PUBLISH_DEADLINE_MS = 30_000;

  /** How long a call waits to reach the sidecar without {@link Builder#connectTimeout}. */
  public static final java.time.Duration DEFAULT_CONNECT_TIMEOUT = java.time.Duration.ofSeconds(5);

  private final ManagedChannel channel;
  private final boolean owned;
  private final String address;
  /** Whether the channel uses TLS (what the probe of a failed call expects). */
  private boolean tls;
  /** The event loop of a Unix socket channel, shut down after it; else null. */
  private final EventLoopGroup group;
  final WindowServiceGrpc.WindowServiceStub async;

  private WindowClient(
      ManagedChannel channel, boolean owned, EventLoopGroup group, String token, String address) {
    this.channel = channel;
    this.address = address;
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

  /** Connects as the environment says: target, token and TLS (see the class comment). */
  public static WindowClient connect() {
    return builder().connect();
  }

  /**
   * Connects to {@code host:port}, or to the Unix socket of {@code unix:PATH} / {@code
   * unix:///PATH} (the target syntax of newer grpc-java; 1.41 has no {@code unix:} name
   * resolver), with the token and TLS of the environment. Plaintext unless {@value #TLS_CA_ENV}
   * (or a client certificate) is set.
   */
  public static WindowClient connect(String target) {
    return builder().target(target).connect();
  }

  /** {@link #connect(String)} with this bearer token (null or empty: none), TLS from the environment. */
  public static WindowClient connect(String target, String token) {
    return builder().target(target).token(token).connect();
  }

  /** Settings that start from the environment ({@link System#getenv}); setters override it. */
  public static Builder builder() {
    return new Builder(System.getenv());
  }

  /** Settings of a connection; {@link #connect} makes it. */
  public static final class Builder {
    private String target;
    private String token;
    private Path tlsCa;
    private Path tlsCert;
    private Path tlsKey;
    private String tlsServerName;
    private boolean plaintext;
    private java.time.Duration connectTimeout = DEFAULT_CONNECT_TIMEOUT;

    Builder(Map<String, String> env) {
      target = nonEmpty(env.get(ADDR_ENV));
      if (target == null) {
        target = DEFAULT_TARGET;
      }
      token = nonEmpty(env.get(TOKEN_ENV));
      tlsCa = path(env.get(TLS_CA_ENV));
      tlsCert = path(env.get(TLS_CERT_ENV));
      tlsKey = path(env.get(TLS_KEY_ENV));
      tlsServerName = nonEmpty(env.get(TLS_SERVER_NAME_ENV));
    }

    private static String nonEmpty(String s) {
      return s == null || s.isEmpty() ? null : s;
    }

    private static Path path(String s) {
      return nonEmpty(s) == null ? null : Path.of(s);
    }

    /** {@code host:port}, {@code unix:PATH} or {@code unix:///PATH}, or any grpc-java target. */
    public Builder target(String target) {
      if (target == null || target.isEmpty()) {
        throw new IllegalArgumentException("a target is host:port or unix:PATH");
      }
      this.target = target;
      return this;
    }

    /** The bearer token sent with every call; null or empty: none. */
    public Builder token(String token) {
      this.token = nonEmpty(token);
      return this;
    }

    /** TLS, verifying the sidecar against this PEM CA file. */
    public Builder tlsCa(Path ca) {
      this.tlsCa = ca;
      this.plaintext = false;
      return this;
    }

    /** Mutual TLS: this PEM client certificate (chain) and its PKCS#8 PEM key. */
    public Builder tlsClientCertificate(Path cert, Path key) {
      this.tlsCert = cert;
      this.tlsKey = key;
      this.plaintext = false;
      return this;
    }

    /** The name the sidecar's certificate must have, instead of the target's host. */
    public Builder tlsServerName(String serverName) {
      this.tlsServerName = nonEmpty(serverName);
      return this;
    }

    /**
     * How long one attempt to reach the sidecar may take before a call fails with a {@link
     * ConnectionException} (default 5 s). A refused connection fails the call at once.
     */
    public Builder connectTimeout(java.time.Duration connectTimeout) {
      if (connectTimeout == null || connectTimeout.toMillis() < 1) {
        throw new IllegalArgumentException("a connect timeout is at least 1 ms");
      }
      this.connectTimeout = connectTimeout;
      return this;
    }

    /** Plaintext, whatever the environment's TLS variables say. */
    public Builder plaintext() {
      this.plaintext = true;
      return this;
    }

    String target() {
      return target;
    }

    String token() {
      return token;
    }

    /** The TLS settings, or null for plaintext. */
    Tls tls() {
      if (plaintext || (tlsCa == null && tlsCert == null && tlsKey == null)) {
        return null;
      }
      return new Tls(tlsCa, tlsCert, tlsKey, tlsServerName);
    }

    /** Makes the channel (connecting lazily, as gRPC does) and the client that owns it. */
    public WindowClient connect() {
      String problem = Probe.addressProblem(target);
      if (problem != null) {
        throw new ConnectionException(target, problem, null);
      }
      Tls tls = tls();
      String path = unixSocketPath(target);
      if (path != null) {
        return connectUnix(path, token, tls, target);
      }
      NettyChannelBuilder b =
          NettyChannelBuilder.forTarget(target)
              .withOption(
                  io.netty.channel.ChannelOption.CONNECT_TIMEOUT_MILLIS,
                  (int) Math.min(Integer.MAX_VALUE, connectTimeout.toMillis()));
      if (tls == null) {
        b.usePlaintext();
      } else {
        b.sslContext(tls.sslContext());
        if (tls.serverName() != null) {
          b.overrideAuthority(tls.serverName());
        }
      }
      WindowClient client = new WindowClient(b.build(), true, null, token, target);
      client.tls = tls != null;
      return client;
    }
  }

  /** Uses a channel the caller owns ({@link #close} leaves it open), with no token. */
  public static WindowClient of(ManagedChannel channel) {
    return of(channel, null);
  }

  /** Uses a channel the caller owns, every call carrying this bearer token. */
  public static WindowClient of(ManagedChannel channel, String token) {
    return new WindowClient(channel, false, null, token, channel.authority());
  }

  /** Whether the channel uses TLS, as far as the client knows. */
  boolean usesTls() {
    return tls;
  }

  /** The address the client dialled (its target), as its errors name it. */
  public String address() {
    return address;
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
  private static WindowClient connectUnix(String path, String token, Tls tls, String target) {
    UnixSockets.Connection c;
    try {
      c = UnixSockets.connect(path, tls);
    } catch (NoClassDefFoundError e) {
      throw new IllegalStateException(
          "unix:" + path + " needs io.netty:netty-transport-native-epoll on the classpath", e);
    }
    return new WindowClient(c.channel(), true, c.group(), token, target);
  }

  /** The generated asynchronous stub, for anything this helper does not cover. */
  public WindowServiceGrpc.WindowServiceStub stub() {
    return async;
  }

  /**
   * One entry to publish: a payload and headers (a stream entry's {@code _payload} and {@code
   * h:<name>} fields; a list value or a channel message carries them in a frame), and optionally
   * a W3C trace context to carry (as the headers {@code traceparent} and {@code tracestate}).
   */
  public record Message(ByteString payload, Map<String, String> headers, TraceContext trace) {
    public Message(ByteString payload, Map<String, String> headers) {
      this(payload, headers, null);
    }

    public static Message of(String payload, Map<String, String> headers) {
      return new Message(ByteString.copyFromUtf8(payload), headers);
    }

    public static Message of(String payload) {
      return of(payload, Map.of());
    }

    /** This message carrying the trace context {@code traceparent} (and {@code tracestate}, may be null). */
    public Message withTrace(String traceparent, String tracestate) {
      TraceContext.Builder t = TraceContext.newBuilder().setTraceparent(traceparent);
      if (tracestate != null) {
        t.setTracestate(tracestate);
      }
      return new Message(payload, headers, t.build());
    }

    PublishEntry toEntry() {
      PublishEntry.Builder e = PublishEntry.newBuilder().setPayload(payload);
      if (headers != null) {
        e.putAllHeaders(headers);
      }
      if (trace != null && !trace.getTraceparent().isEmpty()) {
        e.setTrace(trace);
      }
      return e.build();
    }
  }

  /**
   * Appends the messages to a stream in one call. The future completes with the ids Redis gave
   * them, or with a {@link ConnectionException} (the sidecar cannot be reached: it names the
   * address, the cause, and what answers there instead when that is Redis or an HTTP/1 server), a
   * {@link RedisUnavailableException} (the sidecar's answer that Redis is unavailable), a {@link
   * RefusedException} (for example UNAUTHENTICATED without the sidecar's token), a {@link
   * CallTimeoutException} or a {@link WindowException} carrying the call's status. Asynchronous, so that a producer can keep publishing while
   * earlier calls are in flight; {@code join()} it to wait. Deadline: 30 s ({@link
   * #PUBLISH_DEADLINE_MS}).
   */
  public CompletableFuture<List<String>> publish(String stream, List<Message> messages) {
    return publish(PublishTarget.stream(stream), messages).thenApply(Published::ids);
  }

  /**
   * {@link #publish(String, List)} with a deadline of the caller's own: past it, the future
   * completes with a {@link CallTimeoutException} naming the address and the deadline. Keep it
   * longer than the sidecar's {@code --redis-timeout}, or the sidecar's own answer that Redis is
   * unavailable is lost to the deadline.
   */
  public CompletableFuture<List<String>> publish(
      String stream, List<Message> messages, java.time.Duration deadline) {
    return publish(PublishTarget.stream(stream), messages, deadline).thenApply(Published::ids);
  }

  /**
   * Publishes the messages, in order and in one call, to a stream, a partitioned stream, a list,
   * a channel or a sharded channel ({@link PublishTarget}). The future completes with the stream
   * ids or the channel receiver counts, or with a {@link ConnectionException} or a {@link
   * WindowException} carrying the call's status.
   * Deadline: 30 s ({@link #PUBLISH_DEADLINE_MS}).
   */
  public CompletableFuture<Published> publish(PublishTarget target, List<Message> messages) {
    return publish(target, messages, java.time.Duration.ofMillis(PUBLISH_DEADLINE_MS));
  }

  /**
   * {@link #publish(PublishTarget, List)} with a deadline of the caller's own (positive): past
   * it, the future completes with a {@link CallTimeoutException} naming the address and the
   * deadline. Keep it longer than the sidecar's {@code --redis-timeout}, or the sidecar's own
   * answer that Redis is unavailable is lost to the deadline.
   */
  public CompletableFuture<Published> publish(
      PublishTarget target, List<Message> messages, java.time.Duration deadline) {
    if (deadline == null || deadline.isNegative() || deadline.isZero()) {
      throw new IllegalArgumentException("a publish deadline must be positive, got " + deadline);
    }
    long deadlineMs = Math.max(1, deadline.toMillis());
    PublishRequest.Builder req = PublishRequest.newBuilder();
    switch (target.kind()) {
      case STREAM -> {
        req.setStream(target.name()).setMaxLen(target.maxLen());
        if (target.partitions() > 0) {
          req.setPartitions(target.partitions()).setPartitionBy(target.partitionBy());
        }
      }
      case LIST -> req.setList(target.name());
      case CHANNEL -> req.setChannel(target.name());
      case SHARDED_CHANNEL -> req.setShardedChannel(target.name());
    }
    if (target.raw()) {
      req.setFraming(Framing.FRAMING_RAW);
    }
    for (Message m : messages) {
      req.addEntries(m.toEntry());
    }
    CompletableFuture<Published> result = new CompletableFuture<>();
    async
        .withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS)
        .publish(
            req.build(),
            new StreamObserver<PublishResponse>() {
              @Override
              public void onNext(PublishResponse r) {
                result.complete(new Published(r.getIdsList(), r.getReceiversList()));
              }

              @Override
              public void onError(Throwable t) {
                // Off gRPC's thread: a transport failure probes the address once.
                CompletableFuture.runAsync(
                    () ->
                        result.completeExceptionally(
                            WindowException.of("publish", address, t, tls, deadlineMs)));
              }

              @Override
              public void onCompleted() {
                result.complete(new Published(List.of(), List.of())); // no-op after onNext
              }
            });
    return result;
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

  /**
   * Starts a subscription that takes a read at a time: {@code handler} is called with each read's
   * deliveries as one {@link DeliveryBatch}, one batch at a time, on the subscription's own
   * thread. What reaches the sidecar is what settling each delivery would send.
   */
  public Subscription subscribeBatches(SubscribeOptions options, BatchHandler handler) {
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
