package dev.windowsidecar.client;

/**
 * How the client settles a delivery whose command or outcome the sidecar refused ({@link
 * SubscribeOptions.Builder#rejectedOutcome}). Either way {@link SubscriptionListener#error} gets a
 * {@link RejectedException}.
 */
public enum RejectedOutcome {
  /**
   * The default: for {@code INVALID_COMMAND}, {@code FORBIDDEN_COMMAND} and {@code
   * PERMISSION_DENIED}, which no retry fixes, dead-letter at once when the subscription has a
   * dead letter ({@link SubscribeOptions.Builder#deadLetter}) and drop at once when it has none;
   * {@code retry_after} with the growing delay for any other reason.
   */
  AUTO,
  /** Always drop at once. */
  DROP,
  /**
   * Always {@code retry_after} with the growing delay: with a delivery cap and a dead letter a
   * poison entry ends in the dead letter.
   */
  RETRY_AFTER
}
