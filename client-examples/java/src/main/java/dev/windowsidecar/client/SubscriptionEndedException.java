package dev.windowsidecar.client;

/**
 * A subscription stopped for good: {@link SubscribeOptions.Builder#maxAttempts} consecutive opens
 * failed, or the sidecar answered with a status no retry fixes ({@code UNAUTHENTICATED}, {@code
 * PERMISSION_DENIED}, {@code INVALID_ARGUMENT}, …). {@link Subscription#error()} is this, and
 * {@link SubscriptionListener#error} gets it. The cause is the last failure (a {@link
 * ConnectionException}, or the gRPC status exception).
 */
public class SubscriptionEndedException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final int attempts;

  SubscriptionEndedException(int attempts, Throwable last) {
    super(message(attempts, last), last);
    this.attempts = attempts;
  }

  private static String message(int attempts, Throwable last) {
    String why = last instanceof WindowException ? last.getMessage() : describe(last);
    return attempts > 1
        ? "the subscription ended after " + attempts + " attempts: " + why
        : "the subscription ended: " + why;
  }

  private static String describe(Throwable t) {
    io.grpc.Status st = io.grpc.Status.fromThrowable(t);
    return st.getCode() + (st.getDescription() == null ? "" : ": " + st.getDescription());
  }

  /** The consecutive failed opens before it ended (0 when an open stream failed for good). */
  public int attempts() {
    return attempts;
  }
}
