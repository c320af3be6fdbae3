//! The `cojob` command line (`runs`, `why`, `trigger`, `cancel`, `suspend`, `resume`) as a
//! user runs it: the real binary, against the real kube-apiserver and S3 server, while the
//! harness plays the controller (reconcile passes on a fake clock) and the kubelet.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cojob_controller::index::Decision;
use serde_json::{Value, json};
use support::Harness;

fn cojob(h: &Harness, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cojob"));
    c.args(args)
        .env("COJOB_BUCKET", &h.bucket)
        .env("COJOB_LOG_FORMAT", "text")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs the CLI to completion (nothing plays the controller meanwhile).
fn run(h: &Harness, args: &[&str]) -> Output {
    cojob(h, args).output().expect("run cojob")
}

/// Runs the CLI while reconcile passes of `job` play the controller, until it exits.
async fn run_with_controller(h: &Harness, job: &str, args: &[&str]) -> Output {
    let mut child = cojob(h, args).spawn().expect("spawn cojob");
    for _ in 0..300 {
        if child.try_wait().expect("poll cojob").is_some() {
            return child.wait_with_output().expect("cojob output");
        }
        h.settle(job, 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    panic!("cojob {args:?} did not finish");
}

fn ok_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn runs_and_why_show_every_decision_of_a_schedule() {
    let h = Harness::new("it-cli-runs").await;
    h.create_job(
        "tick",
        json!({"schedule": "*/10 * * * * *", "catchUp": "Latest", "concurrencyPolicy": "Forbid"}),
    )
    .await;
    h.settle("tick", 1).await;
    h.advance(Duration::from_secs(35));
    h.settle("tick", 2).await;
    h.advance(Duration::from_secs(10));
    h.settle("tick", 1).await;
    let decisions = h.decisions("tick").await;
    let job = format!("{}/tick", h.ns);

    let rows = ok_json(&run(&h, &["runs", &job, "-o", "json", "--last", "0"]));
    let rows = rows.as_array().expect("an array of rows");
    assert_eq!(rows.len(), decisions.len(), "{rows:?}");
    for (row, (tick, decision)) in rows.iter().zip(&decisions) {
        assert_eq!(row["tick"], tick.as_str(), "in tick order");
        let (kind, reason, run) = match decision {
            Decision::RunId(id) => ("run", Value::Null, json!(id)),
            Decision::Skipped(why) => ("skipped", json!(why), Value::Null),
            Decision::Missed(why) => ("missed", json!(why), Value::Null),
        };
        assert_eq!(
            (&row["decision"], &row["reason"], &row["run_id"]),
            (&json!(kind), &reason, &run),
            "{row}"
        );
    }
    let ran = rows.iter().find(|r| r["decision"] == "run").expect("a run");
    assert_eq!(ran["lease"]["epoch"], 1);
    assert_eq!(ran["lease"]["state"]["status"], "pending");
    let table = String::from_utf8(run(&h, &["runs", &job, "--last", "2"]).stdout).unwrap();
    assert_eq!(
        table.lines().count(),
        3,
        "a header and the 2 newest rows:\n{table}"
    );
    assert!(
        table.starts_with("TICK") && table.contains("ConcurrencyForbid"),
        "{table}"
    );

    // why, for each kind of decision and for ticks without one.
    let why = |tick: &str| ok_json(&run(&h, &["why", &job, tick, "-o", "json"]));
    for (tick, decision) in &decisions {
        let answer = why(tick);
        let verdict = match decision {
            Decision::RunId(_) => "running",
            Decision::Skipped(_) => "skipped",
            Decision::Missed(_) => "missed",
        };
        assert_eq!(answer["verdict"], verdict, "{tick}: {answer}");
    }
    let skipped = decisions
        .iter()
        .find(|(_, d)| matches!(d, Decision::Skipped(_)))
        .unwrap();
    assert!(
        why(&skipped.0)["explanation"]
            .as_str()
            .unwrap()
            .contains("Forbid")
    );
    assert_eq!(why("2099-01-01T00:00:05Z")["verdict"], "not-a-tick");
    assert_eq!(why("2099-01-01T00:00:10Z")["verdict"], "not-due");
    assert_eq!(
        why("2020-01-01T00:00:10Z")["verdict"],
        "not-a-tick",
        "before creation"
    );
    let said = text(&run(&h, &["why", &job, "2099-01-01T00:00:05Z"]));
    assert!(
        said.contains("2099-01-01T00:00:00.000000Z and 2099-01-01T00:00:10.000000Z"),
        "{said}"
    );

    // Clear errors, never a panic.
    let out = run(&h, &["runs", &format!("{}/nope", h.ns)]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("there is no CoordinatedJob"),
        "{}",
        text(&out)
    );
    let out = run(&h, &["why", &job, "yesterday"]);
    assert!(
        !out.status.success() && text(&out).contains("RFC 3339"),
        "{}",
        text(&out)
    );
    let out = run(
        &h,
        &["runs", &job, "--bucket", "s3://no-such-bucket-cojob/x"],
    );
    assert!(!out.status.success(), "{}", text(&out));
    h.cleanup().await;
}

#[tokio::test]
async fn trigger_cancel_suspend_and_resume_ask_the_controller() {
    let h = Harness::new("it-cli-ask").await;
    h.create_job(
        "man",
        json!({"schedule": "0 0 1 1 *", "concurrencyPolicy": "Forbid"}),
    )
    .await;
    h.settle("man", 1).await;
    let job = format!("{}/man", h.ns);
    let run_id = cojob_controller::layout::trigger_run_id("man", "deploy-7");

    // A trigger, retried with the same key: one run.
    for _ in 0..2 {
        let out = run_with_controller(
            &h,
            "man",
            &[
                "trigger", &job, "--key", "deploy-7", "--wait", "30s", "-o", "json",
            ],
        )
        .await;
        let report = ok_json(&out);
        assert_eq!(report["decision"], "run", "{report}");
        assert_eq!(report["run_id"], run_id.as_str());
    }
    assert_eq!(h.live_pod_names("man").await, vec![format!("{run_id}-1")]);
    // Another key while it runs: Forbid skips it, and says so.
    let out = run_with_controller(
        &h,
        "man",
        &["trigger", &job, "--key", "deploy-8", "-o", "json"],
    )
    .await;
    let report = ok_json(&out);
    assert_eq!(
        (&report["decision"], &report["reason"]),
        (&json!("skipped"), &json!("ConcurrencyForbid"))
    );
    let answer = ok_json(&run(&h, &["why", &job, "trigger/deploy-8", "-o", "json"]));
    assert_eq!(answer["verdict"], "skipped");
    let rows = ok_json(&run(&h, &["runs", &job, "-o", "json"]));
    let ticks: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tick"].as_str().unwrap())
        .collect();
    assert_eq!(ticks, ["trigger/deploy-7", "trigger/deploy-8"]);
    // Without a key, every call is a new request.
    let out = run_with_controller(&h, "man", &["trigger", &job, "--wait", "0s"]).await;
    assert!(text(&out).contains("trigger cli-"), "{}", text(&out));

    // Cancel the active run.
    let out = run_with_controller(&h, "man", &["cancel", &job, &run_id, "--wait", "30s"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("ended cancelled"), "{}", text(&out));
    let lease = h.lease("man", &run_id).await.unwrap();
    assert_eq!(
        cojob_controller::run::RunState::parse(&lease.state)
            .unwrap()
            .status
            .as_str(),
        "cancelled"
    );
    let out = run_with_controller(
        &h,
        "man",
        &["cancel", &job, "man-m000000000000", "--wait", "30s"],
    )
    .await;
    assert!(
        !out.status.success() && text(&out).contains("not an active run"),
        "{}",
        text(&out)
    );

    // Suspend and resume.
    assert!(run(&h, &["suspend", "man", "-n", &h.ns]).status.success());
    assert!(h.job("man").await.spec.suspend);
    assert!(run(&h, &["resume", &job]).status.success());
    assert!(!h.job("man").await.spec.suspend);

    // Bad keys are refused before anything is asked.
    let out = run(&h, &["trigger", &job, "--key", "bad/key"]);
    assert!(
        !out.status.success() && text(&out).contains("trigger key"),
        "{}",
        text(&out)
    );
    h.cleanup().await;
}

/// Runs the CLI while reconcile passes play the controller and every pod that runs is
/// finished at once (the kubelet), until it exits.
async fn run_with_controller_and_kubelet(h: &Harness, job: &str, args: &[&str]) -> Output {
    let mut child = cojob(h, args).spawn().expect("spawn cojob");
    for _ in 0..300 {
        if child.try_wait().expect("poll cojob").is_some() {
            return child.wait_with_output().expect("cojob output");
        }
        h.settle(job, 1).await;
        for pod in h.job_pods(job).await {
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            if !matches!(phase.as_deref(), Some("Succeeded" | "Failed")) {
                h.finish_pod(&kube::ResourceExt::name_any(&pod), 0).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    panic!("cojob {args:?} did not finish");
}

/// `cojob backfill`: a dry run says what would run; the real one runs exactly those ticks; a
/// second, overlapping range runs only its new ticks.
#[tokio::test]
async fn backfill_runs_a_partly_decided_range_without_duplicates() {
    let h = Harness::new("it-cli-backfill").await;
    // Create the job away from a 10-second boundary, with the fake clock started there too:
    // the ticks before the job existed are then exactly those before `created`, whatever the
    // sub-second gap between the clock and the job's creationTimestamp (a tick in that gap made
    // this test count 5 ticks to run instead of 4).
    while !(2..=6).contains(&(chrono::Utc::now().timestamp() % 10)) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    h.clock.set(chrono::Utc::now());
    let created = h.now();
    h.create_job(
        "bf",
        json!({"schedule": "*/10 * * * * *", "catchUp": "Latest"}),
    )
    .await;
    h.settle("bf", 1).await;
    h.advance(Duration::from_secs(35));
    h.settle("bf", 2).await;
    let job = format!("{}/bf", h.ns);
    let time = |secs: i64| cojob::json::format_time(created + chrono::Duration::seconds(secs));
    let (from, to) = (time(-40), time(25));

    let plan = ok_json(&run(
        &h,
        &[
            "backfill",
            &job,
            "--from",
            &from,
            "--to",
            &to,
            "--dry-run",
            "-o",
            "json",
        ],
    ));
    let ticks = plan["ticks"].as_array().unwrap();
    let would_run: Vec<&str> = ticks
        .iter()
        .filter(|t| t["plan"] == "run")
        .map(|t| t["tick"].as_str().unwrap())
        .collect();
    assert_eq!(
        would_run.len(),
        4,
        "the ticks before the job existed: {plan}"
    );
    assert!(ticks.iter().any(|t| t["plan"] == "decided"), "{plan}");
    let before = h.decisions("bf").await.len();
    assert_eq!(
        before,
        h.decisions("bf").await.len(),
        "a dry run changes nothing"
    );

    let args = [
        "backfill",
        &job,
        "--from",
        &from,
        "--to",
        &to,
        "--parallelism",
        "2",
        "--wait",
        "60s",
        "-o",
        "json",
    ];
    let done = ok_json(&run_with_controller_and_kubelet(&h, "bf", &args).await);
    assert_eq!(done["progress"]["done"], true, "{done}");
    assert_eq!(done["progress"]["ran"], 4, "{done}");
    let decisions: std::collections::BTreeMap<String, Decision> =
        h.decisions("bf").await.into_iter().collect();
    for tick in &would_run {
        assert!(
            matches!(decisions.get(*tick), Some(Decision::RunId(_))),
            "{tick}"
        );
    }

    // A wider range that overlaps the first: only its 3 new ticks run.
    let wider = time(-70);
    let args = [
        "backfill", &job, "--from", &wider, "--to", &to, "--wait", "60s", "-o", "json",
    ];
    let done = ok_json(&run_with_controller_and_kubelet(&h, "bf", &args).await);
    assert_eq!(
        (&done["progress"]["done"], &done["progress"]["ran"]),
        (&json!(true), &json!(3)),
        "{done}"
    );
    let runs = h
        .decisions("bf")
        .await
        .iter()
        .filter(|(_, d)| matches!(d, Decision::RunId(_)))
        .count();
    h.settle("bf", 2).await;
    let s = h.job("bf").await.status.unwrap();
    assert_eq!(
        (s.counters.succeeded, s.counters.active),
        (runs as i64, 0),
        "each run once"
    );
    // The table form of a dry run now plans nothing.
    let out = run(
        &h,
        &["backfill", &job, "--from", &wider, "--to", &to, "--dry-run"],
    );
    assert!(text(&out).contains("dry run: 0 of"), "{}", text(&out));
    h.cleanup().await;
}

#[test]
fn kubectl_cojob_is_the_same_command_line_as_a_plugin() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-cojob"))
        .args(["trigger", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("kubectl cojob trigger"), "{help}");
    assert!(help.contains("--key"), "{help}");
}

/// `cojob drain` (the chart's pre-delete hook) lists the jobs' metadata a page at a time, so
/// its memory does not grow with their specs and statuses; it sees a job being deleted as
/// such, deletes the others, and ends once every job is gone.
#[tokio::test]
async fn drain_lists_the_jobs_a_page_at_a_time_and_deletes_them() {
    use kube::api::{DeleteParams, Patch, PatchParams};
    let h = Harness::new("it-cli-drain").await;
    for i in 0..5 {
        h.create_job(&format!("d{i}"), json!({"schedule": "0 0 1 1 *"}))
            .await;
    }
    // One held by another's finalizer while it is deleted.
    let held = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    h.jobs()
        .patch("d0", &PatchParams::default(), &Patch::Merge(&held))
        .await
        .unwrap();
    h.jobs()
        .delete("d0", &DeleteParams::default())
        .await
        .unwrap();
    let mut listed = cojob_controller::cli::operator::list_for_drain(&h.jobs(), 2)
        .await
        .unwrap()
        .expect("the CRD exists");
    listed.sort();
    let names: Vec<(&str, bool)> = listed
        .iter()
        .map(|(ns, name, deleting)| {
            assert_eq!(ns, &h.ns);
            (name.as_str(), *deleting)
        })
        .collect();
    assert_eq!(
        names,
        vec![
            ("d0", true),
            ("d1", false),
            ("d2", false),
            ("d3", false),
            ("d4", false)
        ],
        "five jobs in three pages"
    );
    // The drain deletes the other four; it ends once the held one is let go.
    let mut drain = cojob(&h, &["drain", "--namespace", &h.ns, "--timeout", "60s"])
        .spawn()
        .expect("spawn cojob drain");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(drain.try_wait().unwrap().is_none(), "it waits for d0");
    let left = h.jobs().list(&Default::default()).await.unwrap().items;
    assert_eq!(left.len(), 1, "only the held job is left");
    let free = json!({"metadata": {"finalizers": null}});
    h.jobs()
        .patch("d0", &PatchParams::default(), &Patch::Merge(&free))
        .await
        .unwrap();
    let out = tokio::task::spawn_blocking(move || drain.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("every CoordinatedJob is gone"),
        "{}",
        text(&out)
    );
    h.cleanup().await;
}
