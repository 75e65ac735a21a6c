package dev.windowsidecar.client;

import dev.windowsidecar.v1.OutcomeKind;

/** A command queued on, or an outcome given to, a delivery that already has an outcome. */
public class AlreadySettledException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final long slot;
  private final OutcomeKind outcome;

  AlreadySettledException(Delivery d, OutcomeKind outcome) {
    super(
        "delivery "
            + d.entryId()
            + " (slot "
            + d.slot()
            + ") is already settled ("
            + outcome.name().replaceFirst("^OUTCOME_KIND_", "").toLowerCase(java.util.Locale.ROOT)
            + ")");
    this.slot = d.slot();
    this.outcome = outcome;
  }

  /** The delivery's slot. */
  public long slot() {
    return slot;
  }

  /** The outcome it has. */
  public OutcomeKind outcome() {
    return outcome;
  }
}
