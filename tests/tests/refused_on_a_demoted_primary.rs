//! A primary turned replica under a running sidecar (`READONLY`): pointed at a fixed address,
//! the sidecar keeps its connections through a coordinated failover. The requeues are refused
//! whole, nothing is written or settled, and once the sidecar writes to a primary again (the
//! failback, or the new primary) the entries come back and are requeued as asked, each once.

use std::time::{Duration, Instant};

use window_sidecar::proto;
use window_sidecar_harness::refusals::{
    Form, SHARED_DELAYED, admin, deliveries, due_time_written, due_times_leave_once_settled,
    open_once_the_lease_expires, requeues, stream_entries_come_back_as_asked, unix_ms, zcard,
};
use window_sidecar_harness::*;

/// A simple list's requeues on a primary turned replica (`READONLY`): the entries left Redis
/// when they were popped, so the sidecar holds them; when the roles swap back (a failback) the
/// node takes writes again, the held entries go back to the list, come back counted once more,
/// and are requeued as asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_replica_refuses_the_requeues_whole_simple_list() {
    let form = Form::SimpleList;
    let old = RedisServer::start();
    let new = RedisServer::start_with(&["--replicaof", "127.0.0.1", &old.port().to_string()]);
    let synced = eventually(STEP, || async { replication(new.port()).1 });
    assert!(synced.await, "the replica synced");
    let sidecar = Sidecar::start(&old.url(), &[]).await;
    let on_old = old.client().await;
    let mut client = sidecar.client().await;
    form.add(&on_old, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);
    let swap = |from: u16, to: u16| async move {
        admin(from, &["FAILOVER", "TIMEOUT", "5000"]);
        let swapped = eventually(Duration::from_secs(10), || async {
            replication(from) == ("slave".to_owned(), true) && replication(to).0 == "master"
        });
        assert!(swapped.await, "the failover swapped the roles");
    };
    swap(old.port(), new.port()).await;
    sub.send(vec![], requeues(form, &read)).await;
    let report = sub.flush().await;
    assert!(!report.ok, "{report:?}");
    if !report.requeue_refused.is_empty() {
        assert_eq!(report.requeue_refused.len(), 3, "{report:?}");
        let error = &report.requeue_refused[0].error;
        assert!(error.starts_with("READONLY "), "{report:?}");
    }
    let on_new = new.client().await;
    assert_eq!(form.length(&on_new).await, 0);
    assert_eq!(form.delayed_members(&on_new).await, 0);
    assert_eq!(form.dead_letters(&on_new).await, 0);

    // The failback: the sidecar's node is a primary again and takes the held entries back.
    swap(new.port(), old.port()).await;
    let back = deliveries(&mut sub, 3).await;
    let again: Vec<String> = back.deliveries.iter().map(value).collect();
    assert_eq!(again, values, "{back:?}");
    assert!(
        back.deliveries.iter().all(|d| d.delivery_count == 2),
        "{back:?}"
    );
    sub.send(vec![], requeues(form, &back)).await;
    let report = sub.flush().await;
    assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    let copy = deliveries(&mut sub, 1).await;
    assert_eq!(value(&copy.deliveries[0]), "a", "{copy:?}");
    assert_eq!(form.delayed_members(&on_old).await, 1);
    assert_eq!(form.dead_letters(&on_old).await, 1);
    sub.close();
    sidecar.stop().await;
}

/// `INFO replication`'s `role` of a server (`master` or `slave`) and, for a replica, whether
/// its link to its primary is up.
fn replication(port: u16) -> (String, bool) {
    let info = resp::call_text(port, &["INFO", "replication"]).unwrap_or_default();
    let role = info_field(&info, "role").unwrap_or_default().to_owned();
    let up = info_field(&info, "master_link_status") == Some("up");
    (role, up)
}

/// A primary turned replica under a running sidecar (`READONLY`). The sidecar is pointed at a
/// fixed address (a `redis://` URL, as to a managed service's node or a Service in front of a
/// pod) and a coordinated failover (`FAILOVER`, as managed services and operators run it)
/// swaps the roles while the deliveries are out: the old primary keeps the sidecar's
/// connections and answers its writes with READONLY. Sentinel, by contrast, drops the clients
/// of the primary it demotes, so the sidecar reconnects to the new one (see sentinel.rs). The
/// requeue step is refused whole (on a stream, the scripts that keep its retries pending too):
/// nothing written, nothing settled, seen from the new primary; once the sidecar talks to the
/// new primary the entries come back and are requeued as asked, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_replica_refuses_the_requeues_whole_stream() {
    a_primary_turned_replica_refuses_the_requeues_whole(Form::Stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_replica_refuses_the_requeues_whole_reliable_list() {
    a_primary_turned_replica_refuses_the_requeues_whole(Form::ReliableList).await;
}

async fn a_primary_turned_replica_refuses_the_requeues_whole(form: Form) {
    let old = RedisServer::start();
    let new = RedisServer::start_with(&["--replicaof", "127.0.0.1", &old.port().to_string()]);
    let synced = eventually(STEP, || async { replication(new.port()).1 });
    assert!(synced.await, "the replica synced");
    let metrics = format!("127.0.0.1:{}", free_port());
    // A short consumer lease: the old primary refuses the lease's release too, and the new
    // primary holds the lease as the failover left it until it expires.
    let flags = ["--metrics-listen", &metrics, "--consumer-lease", "1s"];
    let sidecar = Sidecar::start(&old.url(), &flags).await;
    // A reliable list's lease is its heartbeat: as short as the stream's.
    let mut open = form.open(proto::Mode::Pipeline);
    if let Some(proto::open::Source::ReliableList(list)) = &mut open.source {
        list.dead_after = Some(duration(Duration::from_secs(1)));
    }
    let on_old = old.client().await;
    let mut client = sidecar.client().await;
    form.add(&on_old, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);
    // The deliveries (the group's pending entries) reached the replica before the failover.
    let replicated = resp::call(old.port(), &["WAIT", "1", "2000"]).unwrap();
    assert_eq!(replicated.as_int(), Some(1));

    admin(old.port(), &["FAILOVER", "TIMEOUT", "5000"]);
    let swapped = eventually(Duration::from_secs(10), || async {
        replication(old.port()) == ("slave".to_owned(), true)
            && replication(new.port()).0 == "master"
    });
    assert!(swapped.await, "the failover swapped the roles");
    sub.send(vec![], requeues(form, &read)).await;
    let report = sub.flush().await;
    eprintln!("the flush on the demoted primary: {report:?}");
    assert!(!report.ok, "{report:?}");
    assert!(report.settle_failed, "{report:?}");
    if report.requeue_refused.is_empty() {
        // A connection the failover dropped: the step was never sent, or its reply never came.
        assert!(
            report.error.starts_with("not sent") || report.outcome_unknown,
            "{report:?}"
        );
    } else {
        // Each requeue refused: a stream's dead letter first (its step comes first in the
        // flush), then the scripts that keep its retries pending in the group; a list's in
        // the order of its step.
        let refused: &[usize] = match form {
            Form::Stream => &[2, 0, 1],
            _ => &[0, 1, 2],
        };
        let slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
        let expected: Vec<u64> = refused.iter().map(|&i| read.deliveries[i].slot).collect();
        assert_eq!(slots, expected, "{report:?}");
        for (refusal, &i) in report.requeue_refused.iter().zip(refused) {
            assert!(refusal.error.starts_with("READONLY "), "{refusal:?}");
            assert_eq!(refusal.entry_id, read.deliveries[i].entry_id, "{refusal:?}");
        }
        if let Form::Stream = form {
            assert_eq!(report.failed, 3, "{report:?}");
            assert!(report.error.starts_with("READONLY "), "{report:?}");
        }
        let exposition = scrape(&metrics).await;
        let counted = metric_sum(
            &exposition,
            "window_sidecar_requeue_refused_total",
            "reason=\"readonly\"",
        );
        assert_eq!(counted, refused.len() as f64, "{exposition}");
    }
    sub.close();
    sidecar.stop().await;

    // The new primary's view: the three entries still pending on their consumer (on its
    // processing list), no copy, no delay-set member, no dead letter.
    let on_new = new.client().await;
    assert_eq!(form.held(&on_new).await, 3);
    let before = form.length(&on_new).await;
    assert_eq!(before, if let Form::Stream = form { 3 } else { 0 });
    assert_eq!(form.delayed_members(&on_new).await, 0);
    assert_eq!(form.dead_letters(&on_new).await, 0);
    assert_eq!(zcard(&on_new, SHARED_DELAYED).await, 0);

    // The sidecar pointed at the new primary (the address updated, or the URL changed): the
    // entries come back, are requeued as asked, and each requeue is written once.
    let sidecar = Sidecar::start(&new.url(), &["--consumer-lease", "1s"]).await;
    let mut client = sidecar.client().await;
    let mut sub = open_once_the_lease_expires(&mut client, open).await;
    let back = deliveries(&mut sub, 3).await;
    let again: Vec<String> = back.deliveries.iter().map(value).collect();
    assert_eq!(again, values, "{back:?}");
    let (asked, asked_ms) = (Instant::now(), unix_ms());
    sub.send(vec![], requeues(form, &back)).await;
    let report = sub.flush().await;
    assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    if let Form::Stream = form {
        // The same entries, still pending in the group: each ends as asked, nothing appended.
        let ids = |read: &proto::Read| -> Vec<String> {
            read.deliveries.iter().map(|d| d.entry_id.clone()).collect()
        };
        assert_eq!(ids(&back), ids(&read), "{back:?}");
        let id = &back.deliveries[1].entry_id;
        due_time_written(&on_new, &form.delayed(), id, (asked_ms, unix_ms())).await;
        let taken = ([true; 3], false);
        stream_entries_come_back_as_asked(&mut sub, &on_new, &back, taken, asked).await;
        assert_eq!(form.held(&on_new).await, 0);
        assert_eq!(form.length(&on_new).await, 3, "nothing appended");
        assert_eq!(form.dead_letters(&on_new).await, 1);
        assert_eq!(zcard(&on_new, SHARED_DELAYED).await, 0);
        due_times_leave_once_settled(&on_new, &form.delayed(), 0).await;
        sub.close();
        sidecar.stop().await;
        return;
    }
    let copy = deliveries(&mut sub, 1).await;
    assert_eq!(value(&copy.deliveries[0]), "a", "{copy:?}");
    let slot = copy.deliveries[0].slot;
    sub.send(vec![], vec![outcome(slot, proto::OutcomeKind::Ack)])
        .await;
    assert!(sub.flush().await.ok);
    assert!(
        sub.message_within(Duration::from_millis(600))
            .await
            .is_none(),
        "nothing more is delivered"
    );
    assert_eq!(form.held(&on_new).await, 0);
    // A list's entries were all read, the copy too.
    assert_eq!(form.length(&on_new).await, before);
    assert_eq!(form.delayed_members(&on_new).await, 1);
    assert_eq!(form.dead_letters(&on_new).await, 1);
    sub.close();
    sidecar.stop().await;
}
