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
    String name = InProcessServerBuilder.generateName();
    Server server =
        InProcessServerBuilder.forName(name)
            .addService(ServerInterceptors.intercept(fake, record))
            .build()
            .start();
    ManagedChannel channel = InProcessChannelBuilder.forName(name).build();
    try {
      List<WindowClient.Message> one = List.of(WindowClient.Message.of("{}", Map.of()));
      assertEquals(
          List.of("1-0"),
          WindowClient.of(channel, "s3cret").publish("s", one).get(5, TimeUnit.SECONDS));
      assertEquals("Bearer s3cret", seen.poll(5, TimeUnit.SECONDS));
      WindowClient.of(channel).publish("s", one).get(5, TimeUnit.SECONDS);
      assertEquals("(none)", seen.poll(5, TimeUnit.SECONDS));
    } finally {
      channel.shutdownNow();
      server.shutdownNow();
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
    WindowServiceGrpc.WindowServiceImplBase fake =
        new WindowServiceGrpc.WindowServiceImplBase() {
          @Override
          public void publish(PublishRequest req, StreamObserver<PublishResponse> out) {
            seen.add(req);
            PublishResponse.Builder r = PublishResponse.newBuilder();
            if (!req.getStream().isEmpty()) {
              r.addIds("1-0");
            } else if (!req.getChannel().isEmpty()) {
              r.addReceivers(2);
            }
            out.onNext(r.build());
            out.onCompleted();
          }
        };
    String name = InProcessServerBuilder.generateName();
    Server server = InProcessServerBuilder.forName(name).addService(fake).build().start();
    ManagedChannel channel = InProcessChannelBuilder.forName(name).build();
    try {
      WindowClient client = WindowClient.of(channel);
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
    } finally {
      channel.shutdownNow();
      server.shutdownNow();
    }
  }
}
