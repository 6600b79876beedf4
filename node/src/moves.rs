//! `node leave` and `node rebalance`: the operator's side of moving shards.
//!
//! `leave` asks a node to decommission itself (`Request::Decommission`): placement leaves it
//! out, every replica it holds moves to the other members, and it leaves the cluster and exits
//! once it holds none. `rebalance` shows the moves under way; shards move by themselves after
//! every join, leave or failure, so there is nothing to start. With `--wait` both follow the
//! moves to the end, with a progress bar on a terminal and one line a second otherwise.
//!
//! What they do not do: cancel a decommission (restart the node to undo it: a restarted node
//! is not draining), or move a shard by hand.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cluster::wire::{Request, Response, StatusView};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::cli::{
    Everywhere, ask, client, emit, move_json, print_json, print_moves, status_everywhere,
};
use crate::{Output, QueryArgs};

/// `--wait` for `leave` and `rebalance`.
#[derive(Debug, clap::Args)]
pub(crate) struct WaitArgs {
    /// Follow the moves until they are done (a progress bar on a terminal, one line a second
    /// otherwise); exit 1 if they are not done within `--wait-timeout`.
    #[arg(long)]
    pub(crate) wait: bool,
    /// How long `--wait` waits at most, in seconds (1 to 604800, a week).
    #[arg(long, env = "SLOTRING_WAIT_TIMEOUT", default_value_t = 3600,
        value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub(crate) wait_timeout: u64,
    /// How often `--wait` asks the nodes, in milliseconds (10 to 60000). Each round is one
    /// `status` request per live node; shorter rounds see the end of the moves sooner.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub(crate) poll_ms: u64,
}

impl WaitArgs {
    fn poll_every(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }
}

/// Progress toward `total` moves: a bar on a terminal, else a line a second on stderr.
struct Progress {
    what: &'static str,
    bar: Option<ProgressBar>,
    last_line: Option<Instant>,
}

impl Progress {
    fn new(what: &'static str, total: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} {elapsed}")
            {
                bar.set_style(style);
            }
            bar
        });
        Progress {
            what,
            bar,
            last_line: None,
        }
    }

    /// `done` of `total` moved (the total may grow: moves queue up as the view spreads).
    fn show(&mut self, done: u64, total: u64, detail: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(format!("{} {detail}", self.what));
            }
            None => {
                if self
                    .last_line
                    .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
                {
                    self.last_line = Some(Instant::now());
                    eprintln!("{done}/{total} {} {detail}", self.what);
                }
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `node leave`.
pub(crate) async fn leave(query: &QueryArgs, wait: &WaitArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let Response::Status(view) = ask(&endpoint, query.addr, &Request::Status, query).await? else {
        bail!("unexpected answer from {}", query.addr);
    };
    let node = view.node.clone();
    let held = match ask(&endpoint, query.addr, &Request::Decommission, query).await {
        Ok(Response::Decommissioning(held)) => held,
        Ok(other) => bail!("unexpected answer from {}: {other:?}", query.addr),
        Err(error) => {
            eprintln!("error: {error:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    if query.output == Output::Table {
        emit(&format!(
            "{node} is draining: its {} replicas ({} keys) move to the other members, then it leaves\n",
            held.shards, held.keys
        ));
    }
    if !wait.wait {
        if query.output == Output::Json {
            print_json(
                &json!({"version": 1, "node": node.as_str(), "draining": true,
                "held": {"shards": held.shards, "keys": held.keys}, "left": false}),
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(wait.wait_timeout);
    let total = u64::from(held.shards);
    let mut progress = Progress::new("replicas moved away", total);
    let mut remaining = total;
    let left = loop {
        if Instant::now() >= deadline {
            break false;
        }
        match ask(&endpoint, query.addr, &Request::Status, query).await {
            Ok(Response::Status(now)) if now.node == node => {
                remaining = u64::from(now.held.shards);
                let moving = now.moving.len();
                progress.show(
                    total.saturating_sub(remaining),
                    total,
                    &format!("({moving} shards it leads moving)"),
                );
            }
            // Gone (or another process on that address): ask the others whether it left.
            _ => {
                if listed_as_left(&endpoint, &view, &node, query).await {
                    break true;
                }
            }
        }
        tokio::time::sleep(wait.poll_every()).await;
    };
    progress.finish();
    let secs = started.elapsed().as_secs_f64();
    match query.output {
        Output::Json => print_json(
            &json!({"version": 1, "node": node.as_str(), "draining": true,
            "held": {"shards": remaining, "keys": null}, "left": left, "waited_s": secs}),
        ),
        Output::Table if left => emit(&format!(
            "{node} moved every replica away and left the cluster after {secs:.1} s\n"
        )),
        Output::Table => emit(&format!(
            "{node} still holds {remaining} replicas after {secs:.1} s\n"
        )),
    }
    Ok(if left {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Whether a live member of `view` other than `node` lists `node` as `left`.
async fn listed_as_left(
    endpoint: &transport::Endpoint,
    view: &StatusView,
    node: &topology::NodeId,
    query: &QueryArgs,
) -> bool {
    for other in view.nodes.iter().filter(|n| &n.member.id != node) {
        if let Ok(Response::Members(members)) =
            ask(endpoint, other.member.addr, &Request::Members, query).await
        {
            return members
                .members
                .iter()
                .any(|m| &m.id == node && m.state == "left");
        }
    }
    false
}

/// `node rebalance`.
pub(crate) async fn rebalance(query: &QueryArgs, wait: &WaitArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(wait.wait_timeout);
    let mut progress = None;
    let mut most = 0u64;
    loop {
        let Response::Status(view) = ask(&endpoint, query.addr, &Request::Status, query).await?
        else {
            bail!("unexpected answer from {}", query.addr);
        };
        let Everywhere { moves, silent, .. } = status_everywhere(&endpoint, &view, query).await;
        let done = moves.is_empty() && silent.is_empty();
        if !wait.wait || done || Instant::now() >= deadline {
            if let Some(progress) = &progress {
                Progress::finish(progress);
            }
            match query.output {
                Output::Json => print_json(&json!({"version": 1,
                    "moving": moves.iter().map(move_json).collect::<Vec<_>>(),
                    "moving_unknown_from": silent, "done": done,
                    "waited_s": started.elapsed().as_secs_f64()})),
                Output::Table => print_moves(&moves, &silent),
            }
            return Ok(if done || !wait.wait {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        let count = moves.len() as u64;
        most = most.max(count);
        progress
            .get_or_insert_with(|| Progress::new("shards moved", most))
            .show(most - count, most, &format!("({count} moving)"));
        tokio::time::sleep(wait.poll_every()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        wait: WaitArgs,
    }

    fn parse(argv: &[&str]) -> Result<WaitArgs, String> {
        let argv = std::iter::once("node").chain(argv.iter().copied());
        Wrapper::try_parse_from(argv)
            .map(|wrapper| wrapper.wait)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn wait_asks_every_250_ms_unless_told_and_refuses_intervals_out_of_range() {
        assert_eq!(
            parse(&["--wait"]).unwrap().poll_every(),
            Duration::from_millis(250)
        );
        let fast = parse(&["--wait", "--poll-ms", "50"]).unwrap();
        assert_eq!(fast.poll_every(), Duration::from_millis(50));
        for bad in ["9", "60001", "0", "fast"] {
            let error = parse(&["--wait", "--poll-ms", bad]).unwrap_err();
            assert!(error.contains("--poll-ms"), "{bad}: {error}");
        }
    }
}
