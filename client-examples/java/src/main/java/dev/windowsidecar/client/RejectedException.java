package dev.windowsidecar.client;

import dev.windowsidecar.v1.Rejection;

/**
 * The sidecar refused a command or an outcome of a delivery. Handed to {@link
 * SubscriptionListener#error} after the client settled the delivery as {@link
 * SubscribeOptions.Builder#rejectedOutcome} says; never thrown at a call.
 */
public class RejectedException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final String reason;
  private final long slot;
  private final String command;
  private final String sidecarMessage;
  private final transient Delivery delivery;
  private final String outcome;

  RejectedException(Rejection r, Delivery delivery, String outcome) {
    super(describe(r, delivery, outcome));
    this.reason = reasonName(r);
    this.slot = r.getSlot();
    this.command = r.getCommand();
    this.sidecarMessage = r.getMessage();
    this.delivery = delivery;
    this.outcome = outcome;
  }

  static String reasonName(Rejection r) {
    return r.getReason().name().replaceFirst("^REJECTION_REASON_", "");
  }

  private static String describe(Rejection r, Delivery d, String outcome) {
    String what = r.getCommand().isEmpty() ? "the outcome" : "command " + r.getCommand();
    String of = d == null ? "slot " + r.getSlot() : "entry " + d.entryId() + " (slot " + r.getSlot() + ")";
    String s = "the sidecar refused " + what + " of " + of + ": " + reasonName(r) + ": " + r.getMessage();
    return outcome == null || outcome.isEmpty() ? s : s + "; the client settled it with " + outcome;
  }

  /** The RejectionReason's name without its prefix: {@code FORBIDDEN_COMMAND}, … */
  public String reason() {
    return reason;
  }

  /** The delivery's slot. */
  public long slot() {
    return slot;
  }

  /** The refused command's name (empty when an outcome was refused). */
  public String command() {
    return command;
  }

  /** The sidecar's explanation. */
  public String sidecarMessage() {
    return sidecarMessage;
  }

  /** The delivery it belongs to, or null when it was no longer known. */
  public Delivery delivery() {
    return delivery;
  }

  /**
   * What the client settled the delivery with ({@code dead_letter}, {@code drop}, {@code
   * retry_after 1s}; empty: nothing).
   */
  public String outcome() {
    return outcome;
  }
}
