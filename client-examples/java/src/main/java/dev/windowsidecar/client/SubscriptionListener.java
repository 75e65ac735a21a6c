package dev.windowsidecar.client;

import dev.windowsidecar.v1.Opened;
import java.time.Duration;

/**
 * What happens to a subscription's streams, for the application to see (log it, count it,
 * readiness probes). Every method has an empty default; set one with {@link
 * SubscribeOptions.Builder#listener}. Keep them short: they run on the subscription's thread
 * ({@link #opened}, {@link #resubscribed}, {@link #disconnected}) or on a gRPC thread ({@link
 * #draining}).
 */
public interface SubscriptionListener {
  /** The first stream is open (the sidecar's {@code opened} arrived). */
  default void opened(Opened opened) {}

  /**
   * A later stream is open: the subscription was opened again, with the same {@code open}, after
   * its stream ended (a sidecar restart, a drain, a broken connection).
   *
   * @param reconnects the streams opened after the first, this one included
   */
  default void resubscribed(Opened opened, int reconnects) {}

  /**
   * The sidecar is shutting down ({@code draining}): no more deliveries are handed out on this
   * stream; outcomes given within {@code grace} are still sent and flushed. Once the deliveries the
   * handler started are settled the client half-closes the stream, so the sidecar ends it at once
   * (those it received and never handed out are delivered again), and the subscription opens a
   * new stream once this one ends.
   *
   * @param grace how long the sidecar still accepts outcomes
   * @param outstanding deliveries handed out and not settled when the drain began
   */
  default void draining(Duration grace, int outstanding) {}

  /**
   * A stream ended, or could not be opened, with an error a retry may fix; the subscription
   * tries again after {@code retryIn}.
   */
  default void disconnected(Throwable cause, Duration retryIn) {}

  /**
   * An error of the subscription that no call of the application raised: a {@link
   * RejectedException} for each delivery the sidecar refused something of (after the client
   * settled it), a {@link SideEffectException} for each side effect Redis answered with an error
   * and a {@link RequeueRefusedException} for each retry, retryAfter or dead letter Redis did not
   * write (both from a flush report, after {@code onFlush} got it), and the {@link
   * SubscriptionEndedException} the subscription ends with. Runs on a gRPC thread or the
   * subscription's.
   */
  default void error(WindowException error) {}
}
