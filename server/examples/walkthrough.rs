//! A minimal worker over the generated Rust client: publishes five orders, then consumes them
//! through a subscription, queueing one side effect per order and acking it (dropping odd ones).
//!
//! Run the sidecar, then: `cargo run -p window-sidecar --example walkthrough`
//! (`WINDOW_SIDECAR_ADDR` overrides the address, default 127.0.0.1:50051).

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use window_sidecar::proto::subscribe_request::Kind as Request;
use window_sidecar::proto::subscribe_response::Kind as Response;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("WINDOW_SIDECAR_ADDR").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let mut client = WindowServiceClient::connect(format!("http://{addr}")).await?;

    let entries = (1..=5)
        .map(|n| proto::PublishEntry {
            payload: Bytes::from(format!(r#"{{"order":{n},"sku":"sku-{}"}}"#, n % 2)),
            ..Default::default()
        })
        .collect();
    let published = client
        .publish(proto::PublishRequest {
            stream: "walkthrough:orders".into(),
            entries,
            ..Default::default()
        })
        .await?
        .into_inner();
    println!(
        "published {} orders: {:?}",
        published.ids.len(),
        published.ids
    );

    let (tx, rx) = mpsc::channel(8);
    let open = proto::Open {
        source: Some(proto::open::Source::Stream(proto::StreamSource {
            key: "walkthrough:orders".into(),
            group: "walkthrough".into(),
            consumer: "walkthrough-1".into(),
            ..Default::default()
        })),
        count: 5,
        ..Default::default()
    };
    tx.send(proto::SubscribeRequest {
        kind: Some(Request::Open(open)),
    })
    .await?;
    let mut stream = client
        .subscribe(ReceiverStream::new(rx))
        .await?
        .into_inner();

    let mut settled = 0;
    while let Some(message) = stream.message().await? {
        match message.kind {
            Some(Response::Opened(opened)) => println!("opened as consumer {:?}", opened.consumer),
            Some(Response::Read(read)) => {
                let mut batch = proto::Batch::default();
                for delivery in &read.deliveries {
                    let body = String::from_utf8_lossy(&delivery.payload);
                    let keep = delivery.slot % 2 == 1;
                    println!(
                        "slot {} entry {} {body} -> {}",
                        delivery.slot,
                        delivery.entry_id,
                        if keep { "ack" } else { "drop" }
                    );
                    batch.commands.push(proto::QueuedCommand {
                        slot: delivery.slot,
                        name: "HINCRBY".into(),
                        args: vec!["walkthrough:totals".into(), "orders".into(), "1".into()],
                    });
                    let kind = if keep {
                        OutcomeKind::Ack
                    } else {
                        OutcomeKind::Drop
                    };
                    batch.outcomes.push(proto::Outcome {
                        slot: delivery.slot,
                        kind: kind as i32,
                        ..Default::default()
                    });
                }
                tx.send(proto::SubscribeRequest {
                    kind: Some(Request::Batch(batch)),
                })
                .await?;
            }
            Some(Response::Flush(report)) => {
                println!(
                    "flush of read {}: ok={} kept={} dropped={} commands={} settles={}",
                    report.read_id,
                    report.ok,
                    report.segments_kept,
                    report.segments_dropped,
                    report.commands,
                    report.settles
                );
                settled += report.settles;
                if settled >= 5 {
                    break;
                }
            }
            Some(Response::Rejections(r)) => println!("rejected: {:?}", r.rejections),
            Some(Response::Draining(d)) => println!("the sidecar is draining: {d:?}"),
            None => {}
        }
    }
    println!("done: HGET walkthrough:totals orders counts the acked orders only");
    Ok(())
}
