package dev.windowsidecar.client;

import io.grpc.ManagedChannel;
import io.grpc.netty.NettyChannelBuilder;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.epoll.Epoll;
import io.netty.channel.epoll.EpollDomainSocketChannel;
import io.netty.channel.epoll.EpollEventLoopGroup;
import io.netty.channel.unix.DomainSocketAddress;
import java.util.concurrent.TimeUnit;

/**
 * Channels to a Unix socket over Netty's epoll transport. A class of its own because only it
 * needs the optional {@code io.netty:netty-transport-native-epoll}: {@link WindowClient} loads
 * and connects over TCP without that jar on the classpath.
 */
final class UnixSockets {
  private UnixSockets() {}

  /** The channel and the event loop it was given, which the client shuts down after it. */
  record Connection(ManagedChannel channel, EventLoopGroup group) {}

  /**
   * A channel to {@code path}. Plaintext with no other option: the sidecar takes the socket path
   * grpc-java sends as {@code :authority}. With TLS the authority (and the name verified) is the
   * TLS server name, {@code localhost} when none is set.
   */
  static Connection connect(String path, Tls tls) {
    if (!Epoll.isAvailable()) {
      throw new IllegalStateException(
          "unix:" + path + " needs Netty's native epoll library"
              + " (libnetty_transport_native_epoll_<arch>.so on -Djava.library.path, built by"
              + " native-epoll.sh, or io.netty:netty-transport-native-epoll with a linux"
              + " classifier)",
          Epoll.unavailabilityCause());
    }
    EventLoopGroup group = new EpollEventLoopGroup(1);
    try {
      NettyChannelBuilder b =
          NettyChannelBuilder.forAddress(new DomainSocketAddress(path))
              .eventLoopGroup(group)
              .channelType(EpollDomainSocketChannel.class);
      if (tls == null) {
        b.usePlaintext();
      } else {
        b.sslContext(tls.sslContext())
            .overrideAuthority(tls.serverName() == null ? "localhost" : tls.serverName());
      }
      return new Connection(b.build(), group);
    } catch (RuntimeException e) {
      group.shutdownGracefully(0, 0, TimeUnit.SECONDS);
      throw e;
    }
  }
}
