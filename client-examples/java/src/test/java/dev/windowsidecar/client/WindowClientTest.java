package dev.windowsidecar.client;

import static org.junit.Assert.assertEquals;
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
}
