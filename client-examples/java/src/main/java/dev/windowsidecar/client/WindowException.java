package dev.windowsidecar.client;

import io.grpc.Status;

/**
 * The base of the client's own exceptions, the same hierarchy in every window-sidecar client
 * (client-examples/README.md): a failed call of the client, with the gRPC status underneath
 * ({@link #getStatus()}; the {@link io.grpc.StatusRuntimeException} is the cause), so that an
 * application catches these without importing gRPC.
 *
 * <ul>
 *   <li>{@link ConnectionException}: the sidecar cannot be reached (names the address and the
 *       cause);
 *   <li>{@link RejectedException}: the sidecar refused a command or an outcome of a delivery;
 *   <li>{@link SubscriptionEndedException}: a subscription stopped for good;
 *   <li>{@link AlreadySettledException}: a command or an outcome after the delivery's outcome.
 * </ul>
 *
 * A {@code WindowException} itself is any other failed call, for example {@code
 * UNAUTHENTICATED} without the sidecar's token.
 */
public class WindowException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The status (transient: a status is not serializable). */
  private final transient Status status;

  /** An exception with this message and the status of {@code cause} (if it has one). */
  public WindowException(String message, Throwable cause) {
    super(message, cause);
    this.status = cause == null ? null : Status.fromThrowable(cause);
  }

  /** An exception with this message and no status. */
  public WindowException(String message) {
    super(message);
    this.status = null;
  }

  /**
   * The gRPC status of the failed call (its code and description), or null when the error is not
   * a call's.
   */
  public Status getStatus() {
    return status;
  }

  /**
   * A failed call's throwable as the client's exception: a {@link ConnectionException} when the
   * transport could not reach {@code address}, the throwable itself when it is one of ours, else
   * a {@link WindowException} saying {@code "<call>: <CODE>: <description>"}.
   */
  static WindowException of(String call, String address, Throwable t) {
    if (t instanceof java.util.concurrent.CompletionException && t.getCause() != null) {
      t = t.getCause();
    }
    if (t instanceof WindowException w) {
      return w;
    }
    String cause = ConnectionException.causeOf(t);
    if (cause != null) {
      return new ConnectionException(address, cause, t);
    }
    Status st = Status.fromThrowable(t);
    String desc = st.getDescription() == null ? "" : ": " + st.getDescription();
    return new WindowException(call + ": " + st.getCode() + desc, t);
  }
}
