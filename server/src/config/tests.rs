use super::*;

fn parse(args: &[&str]) -> Config {
    Config::try_parse_from(std::iter::once("window-sidecar").chain(args.iter().copied())).unwrap()
}

#[test]
fn defaults_are_valid() {
    let config = parse(&[]);
    config.validate().unwrap();
    assert_eq!(config.listen.to_string(), "127.0.0.1:50051");
    assert_eq!(
        parse(&["--listen", "unix:/run/w.sock"]).listen,
        Listen::Unix("/run/w.sock".into())
    );
    assert!(Config::try_parse_from(["w", "--listen", "localhost"]).is_err());
    assert_eq!(config.redis_url, "redis://127.0.0.1:6379");
    assert_eq!(config.shutdown_grace, Duration::from_secs(10));
    assert_eq!(config.admin_view, AdminView::Loopback);
}

#[test]
fn the_admin_view_is_loopback_unless_a_flag_opens_or_closes_it() {
    assert_eq!(parse(&["--admin-view", "open"]).admin_view, AdminView::Open);
    assert_eq!(parse(&["--admin-view", "off"]).admin_view, AdminView::Off);
    assert!(Config::try_parse_from(["w", "--admin-view", "everyone"]).is_err());
}

#[test]
fn refuses_what_cannot_work() {
    assert!(matches!(
        parse(&["--redis-url", "http://x"]).validate(),
        Err(ConfigError::RedisUrl { .. })
    ));
    assert!(matches!(
        parse(&["--redis-url", "redis://x", "--redis-tls-ca", "/ca.pem"]).validate(),
        Err(ConfigError::TlsWithoutRediss)
    ));
    assert!(matches!(
        parse(&["--redis-url", "rediss://x", "--redis-tls-cert", "/c.pem"]).validate(),
        Err(ConfigError::CertWithoutKey)
    ));
    let password = parse(&["--redis-password", "hunter2"]);
    assert!(!format!("{password:?}").contains("hunter2"));
    for url in [
        "redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001",
        "rediss://u:p@host:6380",
        "redis-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster",
    ] {
        parse(&["--redis-url", url]).validate().unwrap();
    }
    assert!(matches!(
        parse(&["--pool-size", "0"]).validate(),
        Err(ConfigError::TooSmall { .. })
    ));
    assert!(Config::try_parse_from(["w", "--shutdown-grace", "soon"]).is_err());
    assert!(matches!(
        parse(&["--allow-commands", "write"]).validate(),
        Err(ConfigError::CommandRules(_))
    ));
    assert!(Config::try_parse_from(["w", "--max-arg-size", "1GB"]).is_err());
    assert!(matches!(
        parse(&["--allow-keys", ""]).validate(),
        Err(ConfigError::NoPattern("allow-keys"))
    ));
    let err = parse(&["--client-keepalive", "99ms"])
        .validate()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "--client-keepalive must be at least 100 ms, got 99 ms"
    );
}

#[test]
fn the_policy_comes_from_its_flags() {
    let config = parse(&[
        "--allow-keys",
        "{orders}*,count:*",
        "--allow-commands",
        "+@write -del",
        "--max-arg-size",
        "64KiB",
        "--max-message-size",
        "2MiB",
    ]);
    let policy = config.policy().unwrap();
    assert!(policy.keys.allows(b"{orders}:dead"));
    assert!(!policy.keys.allows(b"other"));
    assert!(policy.channels.is_any());
    assert!(!policy.commands.allows("DEL", &["@write".into()]));
    assert_eq!(policy.limits.max_arg_size, 64 << 10);
    assert_eq!(policy.limits.max_message_size, 2 << 20);
    assert_eq!(
        parse(&[]).policy().unwrap().limits,
        Policy::default().limits
    );
}

#[test]
fn redacts_credentials() {
    assert_eq!(
        redact_url("redis://user:secret@host:6379/0"),
        "redis://***@host:6379/0"
    );
    assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
    let err = parse(&["--redis-url", "redis://u:hunter2@"]).validate();
    if let Err(err) = err {
        assert!(!err.to_string().contains("hunter2"));
    }
}

#[test]
fn watched_groups_and_lists_are_named_by_form_and_key() {
    let config = parse(&[
        "--watch",
        "stream:orders:eu:billing",
        "--watch",
        "list:jobs",
    ]);
    assert_eq!(
        config.watch,
        [
            Watch::Stream {
                key: "orders:eu".into(),
                group: "billing".into()
            },
            Watch::List { key: "jobs".into() }
        ]
    );
    for bad in [
        "orders",
        "stream:orders",
        "stream::g",
        "list:",
        "queue:jobs",
    ] {
        let err = Config::try_parse_from(["window-sidecar", "--watch", bad]).unwrap_err();
        assert!(
            err.to_string().contains("stream:<key>:<group>"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn a_kept_key_outside_allow_keys_is_refused_by_name() {
    let keys = Patterns::new(&["orders:*".to_owned()]);
    let keep = vec![
        Watch::Stream {
            key: "orders:in".into(),
            group: "g".into(),
        },
        Watch::List { key: "jobs".into() },
    ];
    let err = check_kept_allowed(&keep, &keys).unwrap_err();
    assert!(
        err.contains("list:jobs") && err.contains("outside --allow-keys"),
        "{err}"
    );
    assert!(check_kept_allowed(&keep[..1], &keys).is_ok());
}
