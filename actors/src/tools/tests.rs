//! Tests of the composed pipeline.

use super::*;
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use warden_protocols::{AgentKey, ToolCategory, ToolSpec};

const TIMEOUT: Duration = Duration::from_secs(5);

fn ctx() -> ToolContext {
    ToolContext {
        agent: AgentKey::new("a"),
        call_id: "call_1".into(),
        lineage: Arc::from(vec![AgentKey::new("a")]),
    }
}

/// A tool that counts its calls and answers from `behaviour(n)` (n = 1, 2, …).
fn counting(
    name: &str,
    calls: Arc<AtomicUsize>,
    behaviour: fn(usize) -> Result<Value, ToolError>,
) -> Arc<dyn Tool> {
    Arc::new(
        FnTool::new(
            name,
            "test tool",
            ToolCategory::SafeChain,
            move |_args, _ctx| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { behaviour(n) }
            },
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "depth": {"type": "integer"}},
            "required": ["path"]
        })),
    )
}

fn registry(tools: Vec<Arc<dyn Tool>>) -> ToolRegistry {
    let mut r = ToolRegistry::new();
    for t in tools {
        r.register(t);
    }
    r
}

fn fail_always(_: usize) -> Result<Value, ToolError> {
    Err(ToolError::Failed("disk on fire".into()))
}

fn ok_n(n: usize) -> Result<Value, ToolError> {
    Ok(json!({ "n": n }))
}

#[tokio::test]
async fn unknown_tool_is_an_error_without_circuit() {
    let runner = ToolRunner::default();
    let run = runner
        .run(&ToolRegistry::new(), "nope", json!({}), ctx(), TIMEOUT)
        .await;
    assert_eq!(run.result, Err(ToolError::Unknown("nope".into())));
    assert_eq!(run.circuit, CircuitStep::NotChecked);
    assert_eq!(run.category, None);
    assert!(!run.executed);
}

#[tokio::test]
async fn invalid_arguments_are_reported_and_not_counted_by_the_circuit() {
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), ok_n)]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 2,
        cool_down: Duration::from_secs(30),
    });
    for _ in 0..5 {
        let run = runner
            .run(&reg, "read", json!({"depth": "deep"}), ctx(), TIMEOUT)
            .await;
        assert_eq!(
            run.result,
            Err(ToolError::InvalidArguments(
                "$: missing required property \"path\"; $.depth: expected integer, got string"
                    .into()
            ))
        );
        assert_eq!(
            run.content(),
            r#"{"error":"invalid arguments: $: missing required property \"path\"; $.depth: expected integer, got string","success":false}"#
        );
        assert!(!run.executed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        runner.circuits().state("read"),
        CircuitState::Closed {
            consecutive_failures: 0
        }
    );
    let run = runner
        .run(&reg, "read", json!({"path": "a"}), ctx(), TIMEOUT)
        .await;
    assert_eq!(run.result, Ok(json!({"n": 1})));
    assert_eq!(
        run.circuit,
        CircuitStep::Admitted {
            probe: false,
            transition: None
        }
    );
}

#[tokio::test]
async fn validation_can_be_switched_off() {
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), ok_n)]);
    let runner = ToolRunner::default().with_policy(
        "read",
        ToolPolicy {
            validate_arguments: false,
            ..ToolPolicy::default()
        },
    );
    let run = runner.run(&reg, "read", json!({}), ctx(), TIMEOUT).await;
    assert!(run.result.is_ok());
}

#[tokio::test]
async fn cache_hits_skip_the_tool_and_ignore_key_order() {
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), ok_n)]);
    let runner = ToolRunner::default().with_policy(
        "read",
        ToolPolicy::cached(CachePolicy::tick(Duration::from_secs(60))),
    );
    let first = runner
        .run(
            &reg,
            "read",
            json!({"path": "a", "depth": 1}),
            ctx(),
            TIMEOUT,
        )
        .await;
    let args: Value = serde_json::from_str(r#"{"depth": 1, "path": "a"}"#).expect("json");
    let second = runner.run(&reg, "read", args, ctx(), TIMEOUT).await;
    assert_eq!(first.result, Ok(json!({"n": 1})));
    assert!(!first.cached);
    assert_eq!(second.result, Ok(json!({"n": 1})));
    assert!(second.cached);
    assert!(!second.executed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    runner.clear_tick();
    let third = runner
        .run(
            &reg,
            "read",
            json!({"path": "a", "depth": 1}),
            ctx(),
            TIMEOUT,
        )
        .await;
    assert_eq!(third.result, Ok(json!({"n": 2})));
}

#[tokio::test]
async fn failures_are_not_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), fail_always)]);
    let runner = ToolRunner::default().with_policy(
        "read",
        ToolPolicy::cached(CachePolicy::session(Duration::from_secs(60))),
    );
    for _ in 0..2 {
        let run = runner
            .run(&reg, "read", json!({"path": "a"}), ctx(), TIMEOUT)
            .await;
        assert!(!run.cached);
        assert!(run.result.is_err());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(runner.cache().is_empty());
}

#[tokio::test]
async fn circuit_opens_and_rejects_without_running_then_probes() {
    tokio::time::pause();
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), |n| {
        if n <= 5 {
            fail_always(n)
        } else {
            ok_n(n)
        }
    })]);
    let runner = ToolRunner::new(CircuitConfig::default());
    let args = json!({"path": "a"});
    for i in 1..=5 {
        let run = runner.run(&reg, "read", args.clone(), ctx(), TIMEOUT).await;
        assert_eq!(run.result, Err(ToolError::Failed("disk on fire".into())));
        let transition = (i == 5).then_some(CircuitTransition::Opened { failures: 5 });
        assert_eq!(
            run.circuit,
            CircuitStep::Admitted {
                probe: false,
                transition
            }
        );
    }
    tokio::time::advance(Duration::from_secs(18)).await;
    let run = runner.run(&reg, "read", args.clone(), ctx(), TIMEOUT).await;
    assert!(run.rejected_by_circuit());
    assert!(!run.executed);
    assert_eq!(
        run.result,
        Err(ToolError::Failed(
            "tool `read` is unavailable: circuit open after 5 failures, retry in 12 s".into()
        ))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    tokio::time::advance(Duration::from_secs(12)).await;
    let run = runner.run(&reg, "read", args, ctx(), TIMEOUT).await;
    assert_eq!(run.result, Ok(json!({"n": 6})));
    assert_eq!(
        run.circuit,
        CircuitStep::Admitted {
            probe: true,
            transition: Some(CircuitTransition::Closed)
        }
    );
}

#[tokio::test]
async fn circuit_rejection_comes_before_validation() {
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), fail_always)]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 1,
        cool_down: Duration::from_secs(30),
    });
    runner
        .run(&reg, "read", json!({"path": "a"}), ctx(), TIMEOUT)
        .await;
    let run = runner.run(&reg, "read", json!(42), ctx(), TIMEOUT).await;
    assert!(run.rejected_by_circuit());
}

#[tokio::test]
async fn invalid_arguments_in_half_open_free_the_probe() {
    tokio::time::pause();
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), |n| {
        if n == 1 {
            fail_always(n)
        } else {
            ok_n(n)
        }
    })]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 1,
        cool_down: Duration::from_secs(30),
    });
    runner
        .run(&reg, "read", json!({"path": "a"}), ctx(), TIMEOUT)
        .await;
    tokio::time::advance(Duration::from_secs(30)).await;
    let bad = runner.run(&reg, "read", json!({}), ctx(), TIMEOUT).await;
    assert!(matches!(bad.result, Err(ToolError::InvalidArguments(_))));
    assert_eq!(
        bad.circuit,
        CircuitStep::Admitted {
            probe: true,
            transition: None
        }
    );
    let good = runner
        .run(&reg, "read", json!({"path": "a"}), ctx(), TIMEOUT)
        .await;
    assert_eq!(
        good.circuit,
        CircuitStep::Admitted {
            probe: true,
            transition: Some(CircuitTransition::Closed)
        }
    );
}

#[tokio::test]
async fn timeout_counts_as_failure() {
    tokio::time::pause();
    let slow: Arc<dyn Tool> = Arc::new(FnTool::new(
        "slow",
        "never ends",
        ToolCategory::SafeChain,
        |_args, _ctx| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(json!(null))
        },
    ));
    let reg = registry(vec![slow]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 1,
        cool_down: Duration::from_secs(30),
    });
    let run = runner
        .run(&reg, "slow", json!({}), ctx(), Duration::from_millis(1500))
        .await;
    assert_eq!(run.result, Err(ToolError::Timeout { after_ms: 1500 }));
    assert!(run.executed);
    assert_eq!(
        run.circuit,
        CircuitStep::Admitted {
            probe: false,
            transition: Some(CircuitTransition::Opened { failures: 1 })
        }
    );
}

/// A tool that panics in `call` itself or in its future, with its own timeout.
struct Unruly {
    panic_in_call: bool,
}

impl Tool for Unruly {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: if self.panic_in_call { "sync" } else { "async" }.into(),
            description: "panics".into(),
            parameters: json!({"type": "object"}),
            category: ToolCategory::Dangerous,
        }
    }
    fn call(
        &self,
        _args: Value,
        _ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        if self.panic_in_call {
            panic!("boom in call");
        }
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            panic!("boom in future")
        })
    }
    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(5))
    }
}

#[tokio::test]
async fn panics_are_caught_and_counted() {
    let reg = registry(vec![
        Arc::new(Unruly {
            panic_in_call: true,
        }),
        Arc::new(Unruly {
            panic_in_call: false,
        }),
    ]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 1,
        cool_down: Duration::from_secs(30),
    });
    let run = runner.run(&reg, "sync", json!({}), ctx(), TIMEOUT).await;
    assert_eq!(run.result, Err(ToolError::Panicked("boom in call".into())));
    assert_eq!(run.category, Some(ToolCategory::Dangerous));
    assert!(runner.circuits().try_acquire("sync").is_err());
}

#[tokio::test]
async fn tool_timeout_overrides_default_and_future_panic_is_caught() {
    tokio::time::pause();
    let reg = registry(vec![Arc::new(Unruly {
        panic_in_call: false,
    })]);
    let runner = ToolRunner::default();
    // The tool's own 5 ms timeout wins over the 5 s default, before the future panics at 10 ms.
    let run = runner.run(&reg, "async", json!({}), ctx(), TIMEOUT).await;
    assert_eq!(run.result, Err(ToolError::Timeout { after_ms: 5 }));

    let panicky: Arc<dyn Tool> = Arc::new(FnTool::new(
        "p",
        "panics in its future",
        ToolCategory::SafeChain,
        |_args, _ctx| async {
            if true {
                panic!("boom in future");
            }
            Ok(json!(null))
        },
    ));
    let run = runner
        .run(&registry(vec![panicky]), "p", json!({}), ctx(), TIMEOUT)
        .await;
    assert_eq!(
        run.result,
        Err(ToolError::Panicked("boom in future".into()))
    );
}

#[tokio::test]
async fn tool_reported_invalid_arguments_do_not_count() {
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls, |_| {
        Err(ToolError::InvalidArguments("no such file".into()))
    })]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 1,
        cool_down: Duration::from_secs(30),
    });
    for _ in 0..3 {
        let run = runner
            .run(&reg, "read", json!({"path": "x"}), ctx(), TIMEOUT)
            .await;
        assert!(run.executed);
        assert!(!run.rejected_by_circuit());
    }
}

#[tokio::test]
async fn dropped_execution_frees_the_probe() {
    tokio::time::pause();
    let calls = Arc::new(AtomicUsize::new(0));
    let calls2 = calls.clone();
    let hang: Arc<dyn Tool> = Arc::new(FnTool::new(
        "hang",
        "fails once, then hangs, then works",
        ToolCategory::SafeChain,
        move |_args, _ctx| {
            let n = calls2.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                match n {
                    1 => Err(ToolError::Failed("first".into())),
                    2 => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        Ok(json!(2))
                    }
                    _ => Ok(json!(n)),
                }
            }
        },
    ));
    let reg = registry(vec![hang]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 1,
        cool_down: Duration::from_secs(30),
    });
    runner.run(&reg, "hang", json!({}), ctx(), TIMEOUT).await;
    tokio::time::advance(Duration::from_secs(30)).await;
    // The probe starts, then a halt drops its future.
    let Admission::Ready(call) = runner.admit(&reg, "hang", json!({})) else {
        panic!("expected the probe to be admitted");
    };
    assert!(call.is_probe());
    let halted = tokio::time::timeout(Duration::from_secs(1), call.execute(ctx(), TIMEOUT)).await;
    assert!(halted.is_err());
    assert_eq!(
        runner.circuits().state("hang"),
        CircuitState::HalfOpen {
            probe_in_flight: false
        }
    );
    let run = runner.run(&reg, "hang", json!({}), ctx(), TIMEOUT).await;
    assert_eq!(run.result, Ok(json!(3)));
    assert_eq!(
        run.circuit,
        CircuitStep::Admitted {
            probe: true,
            transition: Some(CircuitTransition::Closed)
        }
    );
}

#[tokio::test]
async fn circuit_can_be_disabled_per_tool() {
    let calls = Arc::new(AtomicUsize::new(0));
    let reg = registry(vec![counting("read", calls.clone(), fail_always)]);
    let runner = ToolRunner::new(CircuitConfig {
        failure_threshold: 1,
        cool_down: Duration::from_secs(30),
    })
    .with_default_policy(ToolPolicy {
        circuit_breaker: false,
        ..ToolPolicy::default()
    });
    for _ in 0..3 {
        let run = runner
            .run(&reg, "read", json!({"path": "a"}), ctx(), TIMEOUT)
            .await;
        assert_eq!(run.circuit, CircuitStep::NotChecked);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn parse_arguments_accepts_blank_and_reports_bad_json() {
    assert_eq!(parse_arguments("  "), Ok(json!({})));
    assert_eq!(parse_arguments(r#"{"a":1}"#), Ok(json!({"a": 1})));
    assert!(matches!(
        parse_arguments("{nope"),
        Err(ToolError::InvalidArguments(m)) if m.starts_with("arguments are not valid JSON: ")
    ));
}

#[test]
fn runner_is_shareable_and_its_future_is_send() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let runner = ToolRunner::default();
    send_sync(&runner);
    let reg = ToolRegistry::new();
    let fut = runner.run(&reg, "x", json!({}), ctx(), TIMEOUT);
    send(&fut);
    if let Admission::Ready(call) = runner.admit(&reg, "x", json!({})) {
        send(&call.execute(ctx(), TIMEOUT));
    };
}
