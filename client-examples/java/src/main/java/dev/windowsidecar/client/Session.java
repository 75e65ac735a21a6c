package dev.windowsidecar.client;

import dev.windowsidecar.v1.Batch;
import dev.windowsidecar.v1.Draining;
import dev.windowsidecar.v1.FlushReport;
import dev.windowsidecar.v1.Opened;
import dev.windowsidecar.v1.Outcome;
import dev.windowsidecar.v1.OutcomeKind;
import dev.windowsidecar.v1.Read;
import dev.windowsidecar.v1.Rejection;
import dev.windowsidecar.v1.RejectionReason;
import dev.windowsidecar.v1.RequeueRefusal;
import dev.windowsidecar.v1.SideEffectFailure;
import dev.windowsidecar.v1.SubscribeRequest;
import dev.windowsidecar.v1.SubscribeResponse;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.OptionalInt;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/** One Subscribe stream. Everything mutable is guarded by {@link #lock}. */
final class Session implements ClientResponseObserver<SubscribeRequest, SubscribeResponse> {
  /** One Read: its deliveries and whether its batch went out. */
  static final class ReadState {
    final long id;
    /** On a partitioned stream, the partition the read came from ({@code Read.partition}). */
    final OptionalInt partition;
    final List<Delivery> deliveries = new ArrayList<>();
    final List<Delivery> settled = new ArrayList<>(); // in outcome order
    int unsettled;
    boolean sent;

    ReadState(long id, OptionalInt partition) {
      this.id = id;
      this.partition = partition;
    }
  }

  final Object lock = new Object();
  final CompletableFuture<Opened> opened = new CompletableFuture<>();
  final LinkedBlockingQueue<Delivery> inbox = new LinkedBlockingQueue<>();
  final CountDownLatch done = new CountDownLatch(1);
  private final Subscription sub;
  private ClientCallStreamObserver<SubscribeRequest> requests;
  private final Map<Long, ReadState> reads = new HashMap<>();
  private final Map<Long, Delivery> slots = new HashMap<>();
  private boolean dead;
  private boolean closing;
  /** The sidecar sent {@code draining}: outcomes go out one by one, no delivery is handed out. */
  private boolean draining;
  /** Deliveries handed to the application's handler (started) and not settled yet. */
  private int started;
  private Throwable error;

  Session(Subscription sub) {
    this.sub = sub;
  }

  @Override
  public void beforeStart(ClientCallStreamObserver<SubscribeRequest> requestStream) {
    this.requests = requestStream;
  }

  /** Outcomes and commands may still be sent. Called with the lock held. */
  boolean usable() {
    return !dead && !closing;
  }

  boolean isDead() {
    synchronized (lock) {
      return dead;
    }
  }

  /** Why the stream ended: null after a clean close. */
  Throwable error() {
    synchronized (lock) {
      return error;
    }
  }

  /**
   * Marks {@code d} as started, about to be handed to the application; false (not handed out)
   * when the stream has ended or is draining or closing: its entry stays pending and comes back.
   */
  boolean start(Delivery d) {
    synchronized (lock) {
      if (dead || draining || closing) {
        return false;
      }
      d.started = true;
      started++;
      return true;
    }
  }

  void send(SubscribeRequest req) {
    synchronized (lock) {
      sendLocked(req);
    }
  }

  private void sendLocked(SubscribeRequest req) {
    if (dead) {
      return;
    }
    try {
      requests.onNext(req);
    } catch (RuntimeException e) {
      // The call is already closed: onError/onCompleted tells why.
    }
  }

  boolean settle(Delivery d, Outcome outcome) {
    synchronized (lock) {
      if (d.outcome != null) {
        throw new AlreadySettledException(d, d.outcome.getKind());
      }
      if (!usable()) {
        return false;
      }
      d.outcome = outcome;
      if (d.started) {
        d.started = false;
        started--;
      }
      ReadState r = d.read;
      r.settled.add(d);
      if (r.sent) {
        // The read's batch went out already and this delivery was reopened after a rejection.
        sendLocked(batchOf(List.of(d)));
        return true;
      }
      --r.unsettled;
      if (draining || sub.options.ordered()) {
        // Within the grace every outcome counts: send it now, not with the rest of its read.
        // Ordered: a key's next entry waits in the sidecar for this one's flush, the same.
        sendLocked(batchOf(List.of(d)));
        if (draining && started == 0) {
          halfCloseLocked(); // the last started one: the sidecar need not wait for the rest
        }
        return true;
      }
      if (r.unsettled == 0) {
        r.sent = true;
        sendLocked(batchOf(r.settled));
      }
      return true;
    }
  }

  /** Sends {@code extend} for an unsettled delivery (see {@link Delivery#inProgress}). */
  boolean extend(Delivery d) {
    synchronized (lock) {
      if (d.outcome != null) {
        throw new AlreadySettledException(d, d.outcome.getKind());
      }
      if (!usable()) {
        return false;
      }
      sendLocked(SubscribeRequest.newBuilder().setBatch(Batch.newBuilder().addExtend(d.slot())).build());
      return true;
    }
  }

  /**
   * Every command of the (acked) deliveries, then their outcomes in order (with packed acks, the
   * plain acks as slots in {@code acks}). Marks them sent.
   */
  private SubscribeRequest batchOf(List<Delivery> ds) {
    Batch.Builder b = Batch.newBuilder();
    for (Delivery d : ds) {
      if (d.sent) {
        continue;
      }
      if (d.outcome.getKind() == OutcomeKind.OUTCOME_KIND_ACK) {
        b.addAllCommands(d.commands); // commands of other outcomes would be discarded anyway
      }
      if (sub.options.packedAcks && plainAck(d.outcome)) {
        b.addAcks(d.outcome.getSlot());
      } else {
        b.addOutcomes(d.outcome);
      }
      d.sent = true;
    }
    return SubscribeRequest.newBuilder().setBatch(b).build();
  }

  /** An ack with no reason and no trace context: what {@code Batch.acks} carries. */
  static boolean plainAck(Outcome o) {
    return o.getKind() == OutcomeKind.OUTCOME_KIND_ACK && o.getReason().isEmpty() && !o.hasTrace();
  }

  @Override
  public void onNext(SubscribeResponse msg) {
    switch (msg.getKindCase()) {
      case OPENED -> opened.complete(msg.getOpened());
      case READ -> onRead(msg.getRead());
      case FLUSH -> onFlush(msg.getFlush());
      case REJECTIONS -> onRejections(msg.getRejections().getRejectionsList());
      case DRAINING -> onDraining(msg.getDraining());
      default -> {}
    }
  }

  /**
   * The sidecar is shutting down: hand out nothing more, send every outcome given so far now, and
   * each later one as it comes, so that they are flushed within the grace. Once every delivery
   * the handler started is settled (at once when there is none), or the grace is over, the
   * stream is half-closed: the sidecar then ends the subscription at once instead of waiting out
   * its grace for the deliveries this client received and never handed out, which stay pending
   * and are delivered again (to the next stream).
   */
  private void onDraining(Draining d) {
    int handedOut;
    int unsettled;
    Duration grace = Duration.ofSeconds(d.getGrace().getSeconds(), d.getGrace().getNanos());
    synchronized (lock) {
      if (dead || draining) {
        return;
      }
      draining = true;
      inbox.clear();
      List<Delivery> pending = new ArrayList<>();
      for (ReadState r : reads.values()) {
        for (Delivery x : r.settled) {
          if (!x.sent) {
            pending.add(x);
          }
        }
      }
      if (!pending.isEmpty()) {
        sendLocked(batchOf(pending));
      }
      handedOut = d.getOutstanding();
      unsettled = started;
      if (started == 0) {
        halfCloseLocked();
      } else {
        // A drain without a grace (none given) is bounded by the close timeout instead.
        Duration bound = grace.isZero() || grace.isNegative() ? sub.options.closeTimeout : grace;
        CompletableFuture.delayedExecutor(bound.toMillis(), TimeUnit.MILLISECONDS)
            .execute(this::graceOver);
      }
    }
    sub.log(
        "subscription %s: the sidecar is draining (grace %s, %d outstanding, %d started here):"
            + " half-closing once the started ones are settled",
        sub.options.describe(), grace, handedOut, unsettled);
    try {
      sub.options.listener.draining(grace, handedOut);
    } catch (RuntimeException e) {
      sub.log("the draining listener failed: %s", e);
    }
  }

  private void onRead(Read read) {
    if (read.hasFlushed()) {
      onFlush(read.getFlushed()); // about an earlier read: before this one's deliveries
    }
    ReadState r =
        new ReadState(
            read.getReadId(),
            read.hasPartition() ? OptionalInt.of(read.getPartition()) : OptionalInt.empty());
    for (dev.windowsidecar.v1.Delivery pd : read.getDeliveriesList()) {
      r.deliveries.add(new Delivery(pd, this, r));
    }
    r.unsettled = r.deliveries.size();
    if (r.deliveries.isEmpty()) {
      return;
    }
    synchronized (lock) {
      reads.put(r.id, r);
      for (Delivery d : r.deliveries) {
        slots.put(d.slot(), d);
      }
      if (!closing && !draining) {
        inbox.addAll(r.deliveries);
      }
    }
  }

  /**
   * A flush report. An ordered subscription's read may be flushed in parts (a settled delivery
   * whose key has a later entry waiting goes ahead of the rest of its read), so a read can have
   * several reports: each covers the read's outcomes sent since the last one, and the read is done
   * once all of them were (or, the stream closing, the sidecar abandoned the rest).
   */
  private void onFlush(FlushReport report) {
    List<Delivery> settled = new ArrayList<>();
    // What the report says Redis refused, as errors for the listener, with their deliveries
    // (known until this report is handled).
    List<WindowException> errors = new ArrayList<>();
    synchronized (lock) {
      for (SideEffectFailure f : report.getSideEffectFailuresList()) {
        errors.add(new SideEffectException(f, slots.get(f.getSlot())));
      }
      for (RequeueRefusal q : report.getRequeueRefusedList()) {
        Delivery d = q.getSlot() == 0 ? null : slots.get(q.getSlot());
        String outcome = "";
        if (d != null && d.outcome != null) {
          String kind = d.outcome.getKind().name();
          outcome = kind.substring("OUTCOME_KIND_".length()).toLowerCase(Locale.ROOT);
        }
        errors.add(new RequeueRefusedException(q, d, outcome));
      }
      ReadState r = reads.get(report.getReadId());
      if (r != null) {
        for (Delivery d : r.settled) {
          if (d.sent && !d.reported) {
            d.reported = true;
            settled.add(d);
          }
        }
        boolean done = !sub.options.ordered() || dead || closing;
        if (!done) {
          done = r.deliveries.stream().allMatch(d -> d.reported);
        }
        if (done) {
          reads.remove(r.id);
          for (Delivery d : r.deliveries) {
            slots.remove(d.slot());
          }
        } else {
          for (Delivery d : settled) {
            slots.remove(d.slot());
          }
        }
      }
    }
    if (!report.getOk()) {
      sub.log(
          "flush of read %d failed: %s (failed=%d, settle_failed=%s)",
          report.getReadId(), report.getError(), report.getFailed(), report.getSettleFailed());
    }
    if (sub.options.onFlush != null) {
      sub.options.onFlush.accept(new Flush(report, List.copyOf(settled)));
    }
    for (WindowException error : errors) {
      sub.log("%s", error.getMessage());
      sub.reportError(error);
    }
  }

  /**
   * A refused command or outcome is the caller's error, not a retry loop: every delivery whose
   * outcome the sidecar refused (an ack after a refused command is refused as INCOMPLETE_SEGMENT;
   * the slot stays open) is settled as {@link SubscribeOptions#rejectedOutcome} says, without its
   * commands, and the listener's {@code error} gets a {@link RejectedException} naming the cause
   * (the refused command's reason, not the ack's). The sidecar's advice to settle it otherwise is
   * what this does: it is not passed on. An outcome refused ALREADY_SETTLED (on a partitioned
   * stream: its partition was handed over, or fenced, before the outcome came) is not settled
   * again: the entry is the partition's new reader's, and no flush report will name the slot, so
   * the delivery is done for its read here.
   */
  private void onRejections(List<Rejection> rejections) {
    Map<Long, List<Rejection>> bySlot = new LinkedHashMap<>();
    for (Rejection r : rejections) {
      bySlot.computeIfAbsent(r.getSlot(), k -> new ArrayList<>()).add(r);
    }
    for (Map.Entry<Long, List<Rejection>> e : bySlot.entrySet()) {
      Delivery d;
      Rejection why;
      String outcome = "";
      synchronized (lock) {
        d = slots.get(e.getKey());
        why = cause(e.getValue());
        if (d != null) {
          if (!why.getCommand().isEmpty()) {
            d.rejection = why;
          } else if (d.rejection != null) {
            why = d.rejection; // a refused command explains the refused ack that follows it
          }
        }
        if (d != null && d.outcome != null && d.sent && outcomeRefused(e.getValue())) {
          // The slot is still open on the sidecar: settle it anew, without its commands, under
          // the lock that reopened it, so the handler's return never finds it open (and acks
          // it a second time).
          d.outcome = null;
          d.sent = false;
          d.commands = new ArrayList<>();
          d.read.settled.remove(d);
          if (!d.read.sent) {
            d.read.unsettled++; // sent alone (draining): open again in its read's count too
          }
          outcome = resettle(d, why);
        } else if (d != null
            && d.outcome != null
            && d.sent
            && !d.reported
            && refusedAs(e.getValue(), RejectionReason.REJECTION_REASON_ALREADY_SETTLED)) {
          // The slot is not outstanding on the sidecar any more (its partition was handed over,
          // or fenced): no flush report will name it. Reported to the listener all the same.
          unreportedLocked(d);
        } else if (d != null
            && !why.getCommand().isEmpty()
            && d.outcome != null
            && d.outcome.getKind() == OutcomeKind.OUTCOME_KIND_ACK) {
          continue; // the ack's refusal follows in a message of its own: reported then
        }
      }
      RejectedException error = new RejectedException(why, d, outcome);
      sub.log("%s", error.getMessage());
      sub.reportError(error);
    }
  }

  /**
   * The sidecar answered {@code d}'s outcome ALREADY_SETTLED: the slot is no longer outstanding
   * there (its partition was handed over to another replica, or fenced itself), so no flush
   * report will ever name it, and its entry is delivered again by the partition's new reader. It
   * is done for its read as a reported delivery is; once every delivery of the read is, the read
   * is dropped as its last report would have dropped it. Its outcome already took it off the
   * started count. Called with the lock held.
   */
  private void unreportedLocked(Delivery d) {
    d.reported = true;
    slots.remove(d.slot());
    ReadState r = d.read;
    if (r.deliveries.stream().allMatch(x -> x.reported)) {
      reads.remove(r.id, r);
    }
  }

  /** The reads this stream still keeps: those with deliveries not reported yet (for the tests). */
  int heldReads() {
    synchronized (lock) {
      return reads.size();
    }
  }

  /** The slots this stream still keeps: those not reported yet (for the tests). */
  int heldSlots() {
    synchronized (lock) {
      return slots.size();
    }
  }

  /**
   * Settles a reopened delivery as {@link SubscribeOptions#rejectedOutcome} says; returns the
   * outcome's name, empty when it could not be sent. Called with the lock held.
   */
  private String resettle(Delivery d, Rejection why) {
    String reason = "rejected: " + RejectedException.reasonName(why) + ": " + why.getMessage();
    boolean drop = sub.options.rejectedOutcome == RejectedOutcome.DROP;
    boolean deadLetter = false;
    if (sub.options.rejectedOutcome == RejectedOutcome.AUTO) {
      boolean unfixable =
          why.getReason() == RejectionReason.REJECTION_REASON_INVALID_COMMAND
              || why.getReason() == RejectionReason.REJECTION_REASON_FORBIDDEN_COMMAND
              || why.getReason() == RejectionReason.REJECTION_REASON_PERMISSION_DENIED;
      deadLetter = unfixable && hasDeadLetter();
      drop = unfixable && !deadLetter;
    }
    if (deadLetter) {
      return d.deadLetter(reason) ? "dead_letter" : "";
    }
    if (drop) {
      return d.drop(reason) ? "drop" : "";
    }
    Duration delay = sub.options.retryDelay(d.deliveryCount());
    return d.retryAfter(delay, reason) ? "retry_after " + delay : "";
  }

  /** Whether the subscription has a dead-letter target. */
  boolean hasDeadLetter() {
    return sub.options.hasDeadLetter();
  }

  /** The rejection that explains a slot's: a refused command's, else the first. */
  private static Rejection cause(List<Rejection> rejections) {
    for (Rejection r : rejections) {
      if (!r.getCommand().isEmpty()) {
        return r;
      }
    }
    return rejections.get(0);
  }

  private static boolean refusedAs(List<Rejection> rejections, RejectionReason reason) {
    for (Rejection r : rejections) {
      if (r.getReason() == reason) {
        return true;
      }
    }
    return false;
  }

  private static boolean outcomeRefused(List<Rejection> rejections) {
    for (Rejection r : rejections) {
      if (r.getReason() == RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT
          || r.getReason() == RejectionReason.REJECTION_REASON_INVALID_OUTCOME) {
        return true;
      }
    }
    return false;
  }

  @Override
  public void onError(Throwable t) {
    end(t);
  }

  @Override
  public void onCompleted() {
    boolean expected;
    synchronized (lock) {
      expected = closing;
    }
    end(expected ? null : Status.UNAVAILABLE.withDescription("the sidecar ended the stream").asRuntimeException());
  }

  private void end(Throwable t) {
    synchronized (lock) {
      dead = true;
      error = t;
      inbox.clear();
    }
    opened.completeExceptionally(
        t != null ? t : Status.UNAVAILABLE.withDescription("stream ended").asRuntimeException());
    done.countDown();
  }

  /** Cancels the stream: deliveries without a sent outcome stay pending. */
  void cancel(String why) {
    requests.cancel(why, null);
  }

  /** The drain's grace is over with started deliveries unsettled: half-close all the same. */
  private void graceOver() {
    synchronized (lock) {
      if (dead || closing) {
        return;
      }
      sub.log(
          "subscription %s: the drain's grace is over with %d started deliveries unsettled:"
              + " they stay pending and come back",
          sub.options.describe(), started);
      halfCloseLocked();
    }
  }

  /**
   * Sends the outcomes not sent yet (of reads still partly unsettled) and half-closes the stream,
   * once. Called with the lock held.
   */
  private void halfCloseLocked() {
    if (dead || closing) {
      return;
    }
    List<Delivery> pending = new ArrayList<>();
    for (ReadState r : reads.values()) {
      for (Delivery d : r.settled) {
        if (!d.sent) {
          pending.add(d);
        }
      }
    }
    if (!pending.isEmpty()) {
      sendLocked(batchOf(pending));
    }
    closing = true;
    try {
      requests.onCompleted();
    } catch (RuntimeException e) {
      // already closed
    }
  }

  /**
   * Sends the outcomes not sent yet (of reads still partly unsettled), half-closes, and waits for
   * the sidecar to flush and end the stream.
   */
  void shutdown(Duration timeout) throws InterruptedException {
    synchronized (lock) {
      halfCloseLocked();
      closing = true;
      inbox.clear();
    }
    if (!done.await(timeout.toMillis(), TimeUnit.MILLISECONDS)) {
      cancel("close timed out");
      done.await();
    }
  }
}
