package dev.windowsidecar.client;

import dev.windowsidecar.v1.SideEffectFailure;

/**
 * A side-effect command of an acked delivery that Redis answered with an error when it ran
 * ({@code WRONGTYPE}, {@code ERR value is not an integer or out of range}, …), from a flush
 * report's {@code side_effect_failures}. Handed to {@link SubscriptionListener#error} (the report
 * still goes to {@code onFlush}); never thrown at a call.
 *
 * <p>{@link #settled()} says what became of the entry: true in pipeline mode, where it was acked
 * all the same (Redis has no rollback: the other commands ran); false in atomic mode, where its
 * segment stopped at the failed command (the commands before it stay applied), the entry was not
 * acked and is delivered again with its count raised, and at {@code max_deliveries} goes to the
 * dead letter with Redis's error as its reason.
 */
public class SideEffectException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final long slot;
  private final String entryId;
  private final String command;
  private final String redisError;
  private final boolean settled;
  private final transient Delivery delivery;

  SideEffectException(SideEffectFailure f, Delivery delivery) {
    super(describe(f));
    this.slot = f.getSlot();
    this.entryId = f.getEntryId();
    this.command = f.getCommand();
    this.redisError = f.getError();
    this.settled = f.getSettled();
    this.delivery = delivery;
  }

  /** How a message names an entry: its stream id, else (a list value) its slot. */
  static String entryName(String entryId, long slot) {
    return entryId.isEmpty() ? "the entry of slot " + slot : "entry " + entryId;
  }

  private static String describe(SideEffectFailure f) {
    String after =
        f.getSettled()
            ? "settled all the same: Redis has no rollback"
            : "not settled: delivered again, and dead-lettered with this error at max deliveries";
    return "side effect "
        + f.getCommand()
        + " of "
        + entryName(f.getEntryId(), f.getSlot())
        + " failed: "
        + f.getError()
        + " ("
        + after
        + ")";
  }

  /** The delivery's slot. */
  public long slot() {
    return slot;
  }

  /** The stream entry id (empty for a list value or a message). */
  public String entryId() {
    return entryId;
  }

  /** The failed command's name, as queued. */
  public String command() {
    return command;
  }

  /** Redis's error as Redis worded it. */
  public String redisError() {
    return redisError;
  }

  /**
   * Whether the entry was acked all the same (pipeline mode) rather than left pending and
   * delivered again (atomic mode).
   */
  public boolean settled() {
    return settled;
  }

  /** The delivery it belongs to, or null when it was no longer known. */
  public Delivery delivery() {
    return delivery;
  }
}
