package dev.windowsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;

import org.junit.Test;

/** How {@link WindowClient#connect} reads its target. */
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
}
