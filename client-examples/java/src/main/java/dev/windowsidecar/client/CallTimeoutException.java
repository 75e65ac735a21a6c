package dev.windowsidecar.client;

/**
 * The sidecar was reached, but no answer to the call came before its deadline. The sidecar
 * answers within its {@code --redis-timeout} (5 s by default) even when Redis does not, and the
 * client's deadlines are longer (a publish's is 30 s unless the caller gives its own), so this
 * means a sidecar too busy to answer or a deadline set shorter than its {@code --redis-timeout}.
 * A publish that timed out may have been written.
 */
public class CallTimeoutException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final String address;
  private final String call;
  private final long timeoutMs;

  CallTimeoutException(String address, String call, long timeoutMs, Throwable cause) {
    super(
        "the sidecar at "
            + address
            + " did not answer "
            + call
            + (timeoutMs > 0 ? " within " + timeoutMs / 1000.0 + " s" : " in time")
            + "; the sidecar itself waits up to its --redis-timeout (5 s by default) for Redis, so"
            + " a longer silence means it is overloaded or stuck (see its log and metrics), or the"
            + " deadline is shorter than its --redis-timeout; a publish may have been written",
        cause);
    this.address = address;
    this.call = call;
    this.timeoutMs = timeoutMs;
  }

  /** The sidecar's address. */
  public String address() {
    return address;
  }

  /** The call: "publish", "subscribe". */
  public String call() {
    return call;
  }

  /** The call's deadline in milliseconds (0 when unknown). */
  public long timeoutMs() {
    return timeoutMs;
  }
}
