package dev.windowsidecar.client;

import io.grpc.Status;
import java.util.Map;

/**
 * The sidecar refused the call: {@link #reason()} is the status's name ({@code UNAUTHENTICATED},
 * {@code PERMISSION_DENIED}, {@code INVALID_ARGUMENT}, {@code FAILED_PRECONDITION}, {@code
 * RESOURCE_EXHAUSTED}, …) and {@link #details()} the sidecar's reason. The same call gets the same
 * answer. (A command or an outcome of a delivery the sidecar refuses is a {@link
 * RejectedException}.)
 */
public class RefusedException extends WindowException {
  private static final long serialVersionUID = 1L;

  /** What a refused call's reason (its status) asks the caller to do. */
  static final Map<Status.Code, String> STEPS =
      Map.of(
          Status.Code.UNAUTHENTICATED,
          "set WINDOW_SIDECAR_TOKEN to the token of the sidecar's --auth-token-file",
          Status.Code.PERMISSION_DENIED,
          "the sidecar's policy or Redis's ACL does not allow it",
          Status.Code.INVALID_ARGUMENT,
          "the request is not one the sidecar accepts; fix it, retrying will not help",
          Status.Code.FAILED_PRECONDITION,
          "Redis holds something else at that key, or refuses the command; retrying will not help",
          Status.Code.RESOURCE_EXHAUSTED,
          "a limit of the sidecar: send less, or raise the limit",
          Status.Code.OUT_OF_RANGE,
          "a limit of the sidecar: send less, or raise the limit",
          Status.Code.ALREADY_EXISTS,
          "the name is taken");

  private final String address;
  private final String call;
  private final String reason;
  private final String details;

  RefusedException(String address, String call, Status.Code code, String details, Throwable cause) {
    super(
        "the sidecar at " + address + " refused " + call + ": " + code + ": " + details
            + (STEPS.containsKey(code) ? " (" + STEPS.get(code) + ")" : ""),
        cause);
    this.address = address;
    this.call = call;
    this.reason = code.name();
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

  /** The status's name: {@code PERMISSION_DENIED}. */
  public String reason() {
    return reason;
  }

  /** The sidecar's reason. */
  public String details() {
    return details;
  }
}
