//! A job under udrun in which a stranger acts (`udprobe stranger`): ranks
//! 0 and 1 exchange checked messages until the test says it is done, and
//! each writes its process id for the stranger to find its sockets and
//! environment. For the tests of the test drivers: included with
//! `#[path]` beside `udrun_jobs.rs` (as `common`) and `forger.rs`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

/// A running `udprobe stranger` job of 2 ranks.
pub(crate) struct StrangerJob {
    child: Child,
    dir: PathBuf,
    started: Instant,
}

impl StrangerJob {
    /// Starts `probe stranger` under udrun with `env`, in a fresh folder
    /// named after `name` and this process.
    pub(crate) fn start(probe: &str, name: &str, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("udbtl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the job's folder");
        let dir_arg = dir.to_str().expect("a UTF-8 temporary folder");
        let child = crate::common::start(&["-n", "2", probe, "stranger", "--dir", dir_arg], env);
        Self {
            child,
            dir,
            started: Instant::now(),
        }
    }

    /// Whether the job still runs.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Both ranks' process ids, once both wrote them; `None` if the job
    /// ended first, or had not got that far within a minute.
    pub(crate) fn pids(&mut self) -> Option<Vec<u32>> {
        let Self {
            child,
            dir,
            started,
        } = self;
        crate::forger::rank_pids(dir, 2, || {
            !matches!(child.try_wait(), Ok(None)) || started.elapsed() > Duration::from_secs(60)
        })
    }

    /// Tells the ranks the stranger is done, waits for the job, and asserts
    /// that it completed with every message checked both ways; returns
    /// everything it printed (printed here too).
    pub(crate) fn finish(self) -> String {
        std::fs::write(self.dir.join("done"), b"").expect("write the done file");
        let job = crate::common::finish(self.child, Duration::from_secs(120));
        let _ = std::fs::remove_dir_all(&self.dir);
        let (stdout, stderr) = crate::common::text(&job.output);
        let all = format!("{stdout}\n{stderr}");
        println!("{all}");
        assert!(!job.timed_out, "the job hung: {all}");
        assert!(job.output.status.success(), "the job failed: {all}");
        assert_eq!(
            all.matches("messages each way, in order and intact")
                .count(),
            2,
            "{all}"
        );
        all
    }
}
