package dev.windowsidecar.client;

import dev.windowsidecar.v1.RequeueRefusal;

/**
 * Redis refused to write the retry, retryAfter or dead letter of an entry (out of memory, an ACL
 * without the write, a key of the wrong type, a read-only replica), from a flush report's {@code
 * requeue_refused}. The entry was not settled: it stays pending and is delivered again. Handed to
 * {@link SubscriptionListener#error} (the report still goes to {@code onFlush}); never thrown at a
 * call.
 */
public class RequeueRefusedException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final long slot;
  private final String entryId;
  private final String redisError;
  private final String outcome;
  private final transient Delivery delivery;

  RequeueRefusedException(RequeueRefusal r, Delivery delivery, String outcome) {
    super(describe(r, outcome));
    this.slot = r.getSlot();
    this.entryId = r.getEntryId();
    this.redisError = r.getError();
    this.outcome = outcome;
    this.delivery = delivery;
  }

  private static String describe(RequeueRefusal r, String outcome) {
    String what =
        switch (outcome) {
          case "retry" -> "retry";
          case "retry_after" -> "retryAfter";
          case "dead_letter" -> "dead letter";
          default -> r.getSlot() == 0 ? "dead letter" : "requeue";
        };
    return what
        + " of "
        + SideEffectException.entryName(r.getEntryId(), r.getSlot())
        + " not written: "
        + r.getError()
        + "; it stays pending and is delivered again";
  }

  /**
   * The delivery's slot (0 for an entry moved to the dead letter past max deliveries without
   * being delivered).
   */
  public long slot() {
    return slot;
  }

  /** The stream entry id (empty for a list value). */
  public String entryId() {
    return entryId;
  }

  /** Redis's error as Redis worded it. */
  public String redisError() {
    return redisError;
  }

  /**
   * The outcome whose write was refused ({@code retry}, {@code retry_after}, {@code dead_letter};
   * empty when the client does not know it).
   */
  public String outcome() {
    return outcome;
  }

  /** The delivery it belongs to, or null when it was no longer known. */
  public Delivery delivery() {
    return delivery;
  }
}
