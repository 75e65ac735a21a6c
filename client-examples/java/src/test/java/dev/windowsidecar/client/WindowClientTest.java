package dev.windowsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;

import dev.windowsidecar.v1.PublishRequest;
import dev.windowsidecar.v1.PublishResponse;
import dev.windowsidecar.v1.WindowServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.ServerServiceDefinition;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.Test;

/** How {@link WindowClient#connect} reads its target, and what its calls carry. */
public class WindowClientTest {
  /** An in-process sidecar serving {@code service} and a channel to it; close shuts both down. */
  private record InProcess(Server server, ManagedChannel channel) implements AutoCloseable {
    static InProcess serving(ServerServiceDefinition service) throws java.io.IOException {
      String name = InProcessServerBuilder.generateName();
      Server server = InProcessServerBuilder.forName(name).addService(service).build().start();
      return new InProcess(server, InProcessChannelBuilder.forName(name).build());
    }

    /** A sidecar whose publish adds each request to {@code seen}, then answers what {@code answer} gives. */
    static InProcess publishing(
        LinkedBlockingQueue<PublishRequest> seen,
        java.util.function.Function<PublishRequest, PublishResponse> answer)
        throws java.io.IOException {
      return serving(
          new WindowServiceGrpc.WindowServiceImplBase() {
            @Override
            public void publish(PublishRequest req, StreamObserver<PublishResponse> out) {
              seen.add(req);
              out.onNext(answer.apply(req));
              out.onCompleted();
            }
          }.bindService());
    }

    @Override
    public void close() {
      channel.shutdownNow();
      server.shutdownNow();
    }
  }

  @Test
  public void hostPortAndOtherSchemesStayGrpcTargets() {
    assertNull(WindowClient.unixSocketPath("127.0.0.1:50051"));
    assertNull(WindowClient.unixSocketPath("localhost:50051"));
    assertNull(WindowClient.unixSocketPath("dns:///sidecar:50051"));
    assertNull(WindowClient.unixSocketPath("[::1]:50051"));
  }

  @Test
  public void unixTargetsNameTheSocketPath() {
    assertEquals("/run/ws/grpc.sock", WindowClient.unixSocketPath("unix:/run/ws/grpc.sock"));
    assertEquals("/run/ws/grpc.sock", WindowClient.unixSocketPath("unix:///run/ws/grpc.sock"));
    assertEquals("grpc.sock", WindowClient.unixSocketPath("unix:grpc.sock"));
    assertEquals("run/grpc.sock", WindowClient.unixSocketPath("unix:run/grpc.sock"));
  }

  @Test
  public void unixTargetsHaveNoAuthorityAndAPath() {
    for (String target : new String[] {"unix://host/x.sock", "unix:", "unix://"}) {
      assertThrows(
          target, IllegalArgumentException.class, () -> WindowClient.unixSocketPath(target));
    }
  }

  /** A token goes with every call as {@code authorization: Bearer <token>}; none without one. */
  @Test
  public void publishCarriesTheBearerToken() throws Exception {
    Metadata.Key<String> authorization =
        Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    LinkedBlockingQueue<String> seen = new LinkedBlockingQueue<>();
    ServerInterceptor record =
        new ServerInterceptor() {
          @Override
          public <Q, A> ServerCall.Listener<Q> interceptCall(
              ServerCall<Q, A> call, Metadata headers, ServerCallHandler<Q, A> next) {
            String value = headers.get(authorization);
            seen.add(value == null ? "(none)" : value);
            return next.startCall(call, headers);
          }
        };
    WindowServiceGrpc.WindowServiceImplBase fake =
        new WindowServiceGrpc.WindowServiceImplBase() {
          @Override
          public void publish(PublishRequest req, StreamObserver<PublishResponse> out) {
            out.onNext(PublishResponse.newBuilder().addIds("1-0").build());
            out.onCompleted();
          }
        };
    try (InProcess sidecar = InProcess.serving(ServerInterceptors.intercept(fake, record))) {
      List<WindowClient.Message> one = List.of(WindowClient.Message.of("{}", Map.of()));
      assertEquals(
          List.of("1-0"),
          WindowClient.of(sidecar.channel(), "s3cret").publish("s", one).get(5, TimeUnit.SECONDS));
      assertEquals("Bearer s3cret", seen.poll(5, TimeUnit.SECONDS));
      WindowClient.of(sidecar.channel()).publish("s", one).get(5, TimeUnit.SECONDS);
      assertEquals("(none)", seen.poll(5, TimeUnit.SECONDS));
    }
  }

  /** Without anything in the environment: the default target, no token, plaintext. */
  @Test
  public void defaultsWithAnEmptyEnvironment() {
    WindowClient.Builder b = new WindowClient.Builder(Map.of());
    assertEquals("127.0.0.1:50051", b.target());
    assertNull(b.token());
    assertNull(b.tls());
  }

  /** Target, token and TLS from the environment; code wins over it. */
  @Test
  public void theEnvironmentAndWhatCodeOverrides() {
    Map<String, String> env =
        Map.of(
            "WINDOW_SIDECAR_ADDR", "unix:/run/ws.sock",
            "WINDOW_SIDECAR_TOKEN", "t0k",
            "WINDOW_SIDECAR_TLS_CA", "/etc/ws/ca.pem",
            "WINDOW_SIDECAR_TLS_CERT", "/etc/ws/client.pem",
            "WINDOW_SIDECAR_TLS_KEY", "/etc/ws/client.key",
            "WINDOW_SIDECAR_TLS_SERVER_NAME", "sidecar.local");
    WindowClient.Builder b = new WindowClient.Builder(env);
    assertEquals("unix:/run/ws.sock", b.target());
    assertEquals("t0k", b.token());
    Tls tls = b.tls();
    assertNotNull(tls);
    assertEquals(Path.of("/etc/ws/ca.pem"), tls.ca());
    assertEquals(Path.of("/etc/ws/client.pem"), tls.cert());
    assertEquals(Path.of("/etc/ws/client.key"), tls.key());
    assertEquals("sidecar.local", tls.serverName());
    b.target("127.0.0.1:7000").token("").tlsServerName("localhost");
    assertEquals("127.0.0.1:7000", b.target());
    assertNull(b.token());
    assertEquals("localhost", b.tls().serverName());
    assertNull(b.plaintext().tls());
    assertEquals(Path.of("/x/ca.pem"), b.tlsCa(Path.of("/x/ca.pem")).tls().ca());
  }

  /** A CA alone is TLS; a certificate without its key is refused; empty variables are unset. */
  @Test
  public void tlsSettingsFromTheEnvironment() {
    Tls ca = new WindowClient.Builder(Map.of("WINDOW_SIDECAR_TLS_CA", "/ca.pem")).tls();
    assertNotNull(ca);
    assertNull(ca.cert());
    assertNull(ca.serverName());
    assertNull(new WindowClient.Builder(Map.of("WINDOW_SIDECAR_TLS_CA", "")).tls());
    WindowClient.Builder half = new WindowClient.Builder(Map.of("WINDOW_SIDECAR_TLS_CERT", "/c.pem"));
    assertThrows(IllegalArgumentException.class, half::tls);
  }

  /** Publish to a list, a channel, a sharded channel and a trimmed stream, with a trace context. */
  @Test
  public void publishToEveryTarget() throws Exception {
    LinkedBlockingQueue<PublishRequest> seen = new LinkedBlockingQueue<>();
    try (InProcess sidecar =
        InProcess.publishing(
            seen,
            req -> {
              PublishResponse.Builder r = PublishResponse.newBuilder();
              if (!req.getStream().isEmpty()) {
                r.addIds("1-0");
              } else if (!req.getChannel().isEmpty()) {
                r.addReceivers(2);
              }
              return r.build();
            })) {
      WindowClient client = WindowClient.of(sidecar.channel());
      String tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
      List<WindowClient.Message> one =
          List.of(WindowClient.Message.of("p", Map.of("k", "v")).withTrace(tp, null));
      Published list = client.publish(PublishTarget.list("jobs"), one).get(5, TimeUnit.SECONDS);
      PublishRequest req = seen.poll(5, TimeUnit.SECONDS);
      assertEquals("jobs", req.getList());
      assertEquals("", req.getStream());
      assertEquals("p", req.getEntries(0).getPayload().toStringUtf8());
      assertEquals("v", req.getEntries(0).getHeadersOrThrow("k"));
      assertEquals(tp, req.getEntries(0).getTrace().getTraceparent());
      assertEquals(List.of(), list.ids());
      Published ch = client.publish(PublishTarget.channel("news"), one).get(5, TimeUnit.SECONDS);
      assertEquals("news", seen.poll(5, TimeUnit.SECONDS).getChannel());
      assertEquals(List.of(2L), ch.receivers());
      client.publish(PublishTarget.shardedChannel("sh"), one).get(5, TimeUnit.SECONDS);
      assertEquals("sh", seen.poll(5, TimeUnit.SECONDS).getShardedChannel());
      Published st =
          client.publish(PublishTarget.stream("orders").withMaxLen(100), one).get(5, TimeUnit.SECONDS);
      req = seen.poll(5, TimeUnit.SECONDS);
      assertEquals("orders", req.getStream());
      assertEquals(100, req.getMaxLen());
      assertEquals(List.of("1-0"), st.ids());
      client.publish(PublishTarget.list("raw").withRawValues(), List.of(WindowClient.Message.of("x")))
          .get(5, TimeUnit.SECONDS);
      req = seen.poll(5, TimeUnit.SECONDS);
      assertEquals(dev.windowsidecar.v1.Framing.FRAMING_RAW, req.getFraming());
      assertEquals(
          dev.windowsidecar.v1.Framing.FRAMING_UNSPECIFIED,
          client.publish(PublishTarget.list("f"), one).thenApply(p -> seen.poll()).get(5, TimeUnit.SECONDS).getFraming());
      assertThrows(IllegalArgumentException.class, () -> PublishTarget.stream("s").withRawValues());
      assertThrows(IllegalArgumentException.class, () -> PublishTarget.list("l").withMaxLen(5));
      assertThrows(IllegalArgumentException.class, () -> PublishTarget.channel(""));
    }
  }

  /**
   * Publish to a partitioned stream: the request carries the number of partitions and where each
   * entry's key is (a header or a field), with maxLen for each partition; a target that is not
   * one carries neither.
   */
  @Test
  public void publishToAPartitionedStream() throws Exception {
    LinkedBlockingQueue<PublishRequest> seen = new LinkedBlockingQueue<>();
    try (InProcess sidecar =
        InProcess.publishing(
            seen, req -> PublishResponse.newBuilder().addIds("1-0").addIds("1-0").build())) {
      WindowClient client = WindowClient.of(sidecar.channel());
      List<WindowClient.Message> two =
          List.of(
              WindowClient.Message.of("a1", Map.of("k", "a")),
              WindowClient.Message.of("b1", Map.of("k", "b")));
      PublishTarget byHeader = PublishTarget.stream("orders").withPartitionsByHeader(4, "k").withMaxLen(1000);
      assertEquals(4, byHeader.partitions());
      assertEquals("k", byHeader.partitionHeader());
      Published ids = client.publish(byHeader, two).get(5, TimeUnit.SECONDS);
      assertEquals(List.of("1-0", "1-0"), ids.ids());
      PublishRequest req = seen.poll(5, TimeUnit.SECONDS);
      assertEquals("orders", req.getStream());
      assertEquals(4, req.getPartitions());
      assertEquals("k", req.getPartitionBy().getHeader());
      assertEquals(1000, req.getMaxLen());
      assertEquals(2, req.getEntriesCount());
      client.publish(PublishTarget.stream("orders").withPartitionsByField(8, "customer_id"), two)
          .get(5, TimeUnit.SECONDS);
      req = seen.poll(5, TimeUnit.SECONDS);
      assertEquals(8, req.getPartitions());
      assertEquals("customer_id", req.getPartitionBy().getField());
      client.publish("orders", two).get(5, TimeUnit.SECONDS);
      req = seen.poll(5, TimeUnit.SECONDS);
      assertEquals(0, req.getPartitions());
      org.junit.Assert.assertFalse(req.hasPartitionBy());
    }
  }

  /** What the sidecar would refuse after the call is refused at once, naming the fix. */
  @Test
  public void aPartitionedTargetIsAStreamWithOnePartitionKey() {
    PublishTarget s = PublishTarget.stream("orders");
    assertRefused("for a stream", () -> PublishTarget.list("jobs").withPartitionsByHeader(4, "k"));
    assertRefused("for a stream", () -> PublishTarget.channel("news").withPartitionsByField(4, "k"));
    assertRefused("for a stream", () -> PublishTarget.shardedChannel("sh").withPartitionsByHeader(4, "k"));
    assertRefused("needs partitions", () -> s.withPartitionsByHeader(0, "k"));
    assertRefused("got -1", () -> s.withPartitionsByHeader(-1, "k"));
    assertRefused("withPartitionsByHeader(partitions, header)", () -> s.withPartitionsByHeader(4, ""));
    assertRefused(
        "not both",
        () -> new PublishTarget(PublishTarget.Kind.STREAM, "orders", 0, false, 4, "k", "customer_id"));
    assertRefused(
        "withPartitionsByField(partitions, field)",
        () -> new PublishTarget(PublishTarget.Kind.STREAM, "orders", 0, false, 4, null, null));
    assertRefused("raw values", () -> s.withPartitionsByHeader(4, "k").withRawValues());
    assertEquals(
        new PublishTarget(PublishTarget.Kind.STREAM, "orders", 0, false, 0, "", ""),
        PublishTarget.stream("orders"));
  }

  private static void assertRefused(String says, org.junit.function.ThrowingRunnable call) {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, call);
    org.junit.Assert.assertTrue(e.getMessage(), e.getMessage().contains(says));
  }

  /**
   * The sidecar's answer about Redis (quoting Redis's own "Connection refused") is a
   * RedisUnavailableException, not a ConnectionException; a refusal a RefusedException with its
   * reason; a deadline a CallTimeoutException.
   */
  @Test
  public void errorsByCause() {
    String addr = "127.0.0.1:50051";
    WindowException redis =
        WindowException.of(
            "publish",
            addr,
            io.grpc.Status.UNAVAILABLE
                .withDescription(
                    "Redis did not answer in time (XADD: Request timed out.; last connection error:"
                        + " Os { code: 111, kind: ConnectionRefused, message: \"Connection refused\" })")
                .asRuntimeException());
    org.junit.Assert.assertTrue(redis.toString(), redis instanceof RedisUnavailableException);
    org.junit.Assert.assertTrue(
        redis.getMessage(),
        redis.getMessage().startsWith("the sidecar at " + addr + " answered publish that Redis is unavailable")
            && redis.getMessage().contains("--redis-url"));
    assertEquals(io.grpc.Status.Code.UNAVAILABLE, redis.getStatus().getCode());
    WindowException refused =
        WindowException.of(
            "publish", addr, io.grpc.Status.UNAUTHENTICATED.withDescription("token").asRuntimeException());
    org.junit.Assert.assertTrue(refused instanceof RefusedException);
    assertEquals("UNAUTHENTICATED", ((RefusedException) refused).reason());
    org.junit.Assert.assertTrue(refused.getMessage().contains("WINDOW_SIDECAR_TOKEN"));
    WindowException late =
        WindowException.of(
            "publish", addr, io.grpc.Status.DEADLINE_EXCEEDED.asRuntimeException(), false, 30_000);
    org.junit.Assert.assertTrue(late instanceof CallTimeoutException);
    org.junit.Assert.assertTrue(late.getMessage(), late.getMessage().contains("did not answer publish within 30.0 s"));
  }

  /**
   * A publish given its own deadline fails past it with a CallTimeoutException naming the
   * address, the call and that deadline (not the default 30 s); a deadline that is not positive
   * is refused at the call.
   */
  @Test
  public void aPublishDeadlineOfTheCallersOwn() throws Exception {
    WindowServiceGrpc.WindowServiceImplBase silent =
        new WindowServiceGrpc.WindowServiceImplBase() {
          @Override
          public void publish(PublishRequest req, StreamObserver<PublishResponse> out) {
            // Never answers: the call's deadline ends it.
          }
        };
    try (InProcess sidecar = InProcess.serving(silent.bindService())) {
      ManagedChannel channel = sidecar.channel();
      WindowClient client = WindowClient.of(channel);
      List<WindowClient.Message> one = List.of(WindowClient.Message.of("{}", Map.of()));
      long began = System.nanoTime();
      java.util.concurrent.ExecutionException failed =
          assertThrows(
              java.util.concurrent.ExecutionException.class,
              () ->
                  client
                      .publish(PublishTarget.stream("s"), one, java.time.Duration.ofMillis(200))
                      .get(10, TimeUnit.SECONDS));
      long tookMs = (System.nanoTime() - began) / 1_000_000;
      org.junit.Assert.assertTrue("took " + tookMs + " ms", tookMs < 5_000);
      org.junit.Assert.assertTrue(
          failed.getCause().toString(), failed.getCause() instanceof CallTimeoutException);
      CallTimeoutException late = (CallTimeoutException) failed.getCause();
      assertEquals(200, late.timeoutMs());
      assertEquals("publish", late.call());
      assertEquals(channel.authority(), late.address());
      org.junit.Assert.assertTrue(
          late.getMessage(),
          late.getMessage()
              .startsWith("the sidecar at " + channel.authority() + " did not answer publish within 0.2 s"));
      assertThrows(
          IllegalArgumentException.class,
          () -> client.publish("s", one, java.time.Duration.ZERO));
      assertThrows(
          IllegalArgumentException.class,
          () -> client.publish("s", one, java.time.Duration.ofSeconds(-1)));
    }
  }

  @Test
  public void aProbeNamesWhatAnswers() {
    byte[] pong = "+PONG\r\n".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    org.junit.Assert.assertTrue(Probe.whatAnswers(pong, pong.length, false).startsWith("a Redis server answers there"));
    byte[] http = "HTTP/1.1 400 Bad Request\r\n".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    org.junit.Assert.assertTrue(Probe.whatAnswers(http, http.length, false).startsWith("an HTTP/1 server answers there"));
    byte[] alert = {0x15, 0x03, 0x03, 0x00, 0x02};
    org.junit.Assert.assertTrue(Probe.whatAnswers(alert, alert.length, false).startsWith("a TLS server"));
    assertNull(Probe.whatAnswers(alert, alert.length, true));
    byte[] settings = {0x00, 0x00, 0x12, 0x04};
    assertNull(Probe.whatAnswers(settings, settings.length, false));
  }

  @Test
  public void aPublishToARedisPortSaysSo() throws Exception {
    try (java.net.ServerSocket redis = new java.net.ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress())) {
      Thread t =
          new Thread(
              () -> {
                while (!redis.isClosed()) {
                  try (java.net.Socket s = redis.accept()) {
                    s.getInputStream().read(new byte[256]);
                    s.getOutputStream()
                        .write("-ERR wrong number of arguments for 'ping' command\r\n".getBytes(java.nio.charset.StandardCharsets.US_ASCII));
                  } catch (java.io.IOException e) {
                    return;
                  }
                }
              });
      t.setDaemon(true);
      t.start();
      String addr = "127.0.0.1:" + redis.getLocalPort();
      try (WindowClient client = WindowClient.builder().target(addr).plaintext().connect()) {
        java.util.concurrent.CompletionException failed =
            assertThrows(
                java.util.concurrent.CompletionException.class,
                () -> client.publish("s", List.of(WindowClient.Message.of("a"))).join());
        org.junit.Assert.assertTrue(String.valueOf(failed.getCause()), failed.getCause() instanceof ConnectionException);
        org.junit.Assert.assertTrue(
            failed.getCause().getMessage(),
            failed.getCause().getMessage().startsWith("cannot reach the sidecar at " + addr + ": a Redis server answers there"));
      }
    }
  }

  @Test
  public void aUrlIsRefusedNamingHostAndPort() {
    for (String[] c :
        new String[][] {
          {"http://127.0.0.1:50051", "give 127.0.0.1:50051"},
          {"https://sidecar:443/", "give sidecar:443 and WINDOW_SIDECAR_TLS_CA"},
          {"redis://127.0.0.1:6379", "a Redis URL"}
        }) {
      ConnectionException e =
          assertThrows(ConnectionException.class, () -> WindowClient.builder().target(c[0]).plaintext().connect());
      org.junit.Assert.assertTrue(e.getMessage(), e.getMessage().contains("the address is a") && e.getMessage().contains(c[1]));
      org.junit.Assert.assertFalse(e.getMessage().contains("resolve"));
    }
  }
}
