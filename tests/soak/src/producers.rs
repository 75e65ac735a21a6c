//! The producers: one task per key or channel, writing numbered tokens at a steady pace through
//! Redis, or through the sidecar's `Publish` for every other stream.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use fred::prelude::*;
use tokio::sync::watch;
use tonic::transport::Channel;
use window_sidecar::proto;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar_harness::connect_within;

use crate::plan::{DEADLINE, Form, PER_TICK, TICK, Target};
use crate::stop::stopped;

/// Writes `PER_TICK` numbered tokens every `TICK` until told to stop, counting them produced.
pub(crate) async fn producer(
    target: Arc<Target>,
    redis: Client,
    addr: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut publish = if target.via_publish {
        Some(connect_within(&addr, DEADLINE).await)
    } else {
        None
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => return,
        }
        let tokens: Vec<String> = (0..PER_TICK)
            .map(|_| {
                n += 1;
                format!("{}#{n}", target.produce_to)
            })
            .collect();
        write(&target, &redis, publish.as_mut(), &tokens).await;
        target
            .tally
            .produced
            .fetch_add(tokens.len() as u64, Relaxed);
    }
}

/// Writes one tick's tokens to the target: through the sidecar's `Publish` when it has a
/// client for it, else with the Redis command of its form.
async fn write(
    target: &Target,
    redis: &Client,
    publish: Option<&mut WindowServiceClient<Channel>>,
    tokens: &[String],
) {
    match (target.form, publish) {
        (Form::Stream, Some(client)) => {
            let ids = client
                .publish(proto::PublishRequest {
                    stream: target.produce_to.clone(),
                    entries: tokens
                        .iter()
                        .map(|t| proto::PublishEntry {
                            payload: t.clone().into(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .await
                .expect("Publish")
                .into_inner()
                .ids;
            assert_eq!(ids.len(), tokens.len());
        }
        (Form::Stream, None) => {
            for token in tokens {
                let _: Value = redis
                    .custom(
                        fred::cmd!("XADD"),
                        vec![target.produce_to.as_str(), "*", "_payload", token.as_str()],
                    )
                    .await
                    .expect("XADD");
            }
        }
        (Form::Reliable | Form::Simple, _) => {
            let mut args = vec![target.produce_to.clone()];
            args.extend(tokens.iter().cloned());
            let _: Value = redis
                .custom(fred::cmd!("LPUSH"), args)
                .await
                .expect("LPUSH");
        }
        (Form::PubSub, _) => {
            for token in tokens {
                let heard: i64 = redis
                    .custom(
                        fred::cmd!("PUBLISH"),
                        vec![target.produce_to.as_str(), token.as_str()],
                    )
                    .await
                    .expect("PUBLISH");
                assert_eq!(heard, 1, "{token}: the sidecar's subscriber is listening");
            }
        }
    }
}
