package dev.windowsidecar.client;

/**
 * The sidecar answered the call, and its answer is that Redis is unavailable: {@code UNAVAILABLE}
 * from the sidecar itself (Redis is unreachable, did not answer within the sidecar's {@code
 * --redis-timeout}, or refused the sidecar's credentials), as opposed to a transport that failed
 * (a {@link ConnectionException}). The sidecar is reachable: the fault is between it and Redis.
 */
public class RedisUnavailableException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final String address;
  private final String call;
  private final String details;

  RedisUnavailableException(String address, String call, String details, Throwable cause) {
    super(
        "the sidecar at "
            + address
            + " answered "
            + call
            + " that Redis is unavailable: "
            + details
            + "; check that Redis is up and that the sidecar's --redis-url reaches it (the"
            + " sidecar's log says more)",
        cause);
    this.address = address;
    this.call = call;
    this.details = details;
  }

  /** The sidecar's address. */
  public String address() {
    return address;
  }

  /** The call: "publish", "subscribe". */
  public String call() {
    return call;
  }

  /** The sidecar's message. */
  public String details() {
    return details;
  }
}
