//! `glmc run --device cuda --tp N`: where this process's ranks go (one host, or one process
//! per host with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), the group's NCCL id (made by
//! process 0, fetched over TCP by the others), and the group started on the GPUs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use glmc_models::ModelConfig;
use glmc_runtime::bootstrap::{self, Group};
use glmc_runtime::cuda::nccl::{self, NcclError, UniqueId};
use glmc_runtime::cuda::tp::{
    self, GroupOptions, GroupWeights, Kill, Placement, RankArtifact, TpExecutor,
};
use glmc_runtime::cuda::Gpu;
use glmc_runtime::trace::Fault;

use crate::cli::RunArgs;

/// The port process 0 listens on when neither --master-port nor $MASTER_PORT says.
const DEFAULT_PORT: u16 = 29500;

/// This process's place among the processes of one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processes {
    pub world: u64,
    pub rank: u64,
    /// `host:port` of process 0, when there are several processes.
    pub master: Option<String>,
}

impl Processes {
    /// From the flags, else the environment (`env` reads a variable).
    pub fn from_args(
        args: &RunArgs,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Processes> {
        let number = |flag: Option<u64>, var: &str, default: u64| -> anyhow::Result<u64> {
            match (flag, env(var)) {
                (Some(v), _) => Ok(v),
                (None, Some(text)) => text.trim().parse().map_err(|_| {
                    anyhow::anyhow!(
                        "${var} is `{text}`, not a number: set it to an integer, or pass the flag"
                    )
                }),
                (None, None) => Ok(default),
            }
        };
        let world = number(args.world_size, "WORLD_SIZE", 1)?;
        let rank = number(args.rank, "RANK", 0)?;
        if world == 0 || rank >= world {
            bail!("process rank {rank} is not a process of --world-size {world}: ranks are 0..{world}");
        }
        if !args.tp.is_multiple_of(world) {
            bail!(
                "--tp {} is not divisible by --world-size {world}: every process drives the same number of GPUs",
                args.tp
            );
        }
        let master = if world > 1 {
            let Some(host) = args.master_addr.clone().or_else(|| env("MASTER_ADDR")) else {
                bail!("--world-size {world} needs the host of process 0: pass --master-addr HOST or set MASTER_ADDR");
            };
            let port = match (args.master_port, env("MASTER_PORT")) {
                (Some(p), _) => p,
                (None, Some(text)) => text
                    .trim()
                    .parse()
                    .map_err(|_| anyhow::anyhow!("$MASTER_PORT is `{text}`, not a TCP port"))?,
                (None, None) => DEFAULT_PORT,
            };
            Some(format!("{host}:{port}"))
        } else {
            None
        };
        Ok(Processes {
            world,
            rank,
            master,
        })
    }

    /// This process's ranks of a group of `tp`: consecutive, one per local GPU from GPU 0.
    pub fn placement(&self, tp: u64) -> Placement {
        let local = tp / self.world;
        Placement {
            world: tp as usize,
            first_rank: (self.rank * local) as usize,
            gpus: (0..local as usize).collect(),
        }
    }

    /// The group's NCCL id: made here by process 0 (and served to the others when there are
    /// several), fetched from process 0 by the others.
    fn unique_id(&self, tp: u64, timeout: Duration) -> anyhow::Result<UniqueId> {
        let group = Group {
            processes: self.world as u32,
            ranks: tp as u32,
        };
        match (&self.master, self.rank) {
            (None, _) => Ok(UniqueId::new()?),
            (Some(addr), 0) => {
                let id = UniqueId::new()?;
                bootstrap::serve(addr, group, &id.0, timeout)?;
                Ok(id)
            }
            (Some(addr), _) => Ok(UniqueId(bootstrap::fetch(addr, group, timeout)?)),
        }
    }
}

/// Refuses a `--tp` run the host cannot hold, before anything is compiled: too few GPUs for
/// this process's ranks, or no NCCL.
pub fn check_host(args: &RunArgs, processes: &Processes) -> anyhow::Result<()> {
    let local = (args.tp / processes.world) as usize;
    tp::check_gpus(args.tp as usize, local, Gpu::count()?)?;
    if !nccl::present() {
        return Err(NcclError::Missing.into());
    }
    Ok(())
}

/// Starts this process's ranks of the group on their GPUs with their artifacts (by local
/// rank), joined through the id process 0 makes.
pub fn start(
    args: &RunArgs,
    processes: &Processes,
    artifacts: Vec<RankArtifact<ModelConfig>>,
    weights: GroupWeights,
) -> anyhow::Result<TpExecutor> {
    let timeout = Duration::from_secs_f64(args.collective_timeout);
    // Fetching the id waits for process 0, which may still be compiling: more than one
    // collective's patience.
    let id = processes.unique_id(args.tp, timeout.max(Duration::from_secs(600)))?;
    let options = GroupOptions {
        timeout,
        graphs: !args.no_cuda_graphs,
        fault: Fault::from_env(),
        kill: Kill::from_env(),
    };
    let placement = processes.placement(args.tp);
    Ok(TpExecutor::start(
        artifacts, weights, &placement, id, &options,
    )?)
}

/// The weights of a group: generated on each GPU by `random_cubin` when given, else made on the
/// host from `source`.
pub fn group_weights(
    source: Arc<dyn glmc_runtime::WeightSource + Send + Sync>,
    random: Option<(glmc_runtime::RandomWeights, Vec<u8>)>,
) -> GroupWeights {
    match random {
        Some((weights, cubin)) => GroupWeights::Random {
            weights,
            cubin: Arc::new(cubin),
        },
        None => GroupWeights::Host(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> RunArgs {
        let mut argv = vec![
            "glmc",
            "run",
            "m.ron",
            "--prompt-ids",
            "1",
            "--device",
            "cuda",
        ];
        argv.extend_from_slice(extra);
        match crate::cli::Cli::parse_from(argv).command {
            crate::cli::Command::Run(a) => a,
            _ => unreachable!("a run command"),
        }
    }

    #[test]
    fn one_host_by_default_and_env_places_a_process_of_several() {
        let none = |_: &str| None;
        let p = Processes::from_args(&args(&["--tp", "2"]), none).unwrap();
        assert_eq!(p.world, 1);
        assert_eq!(p.placement(2).gpus, vec![0, 1]);
        let env = |v: &str| match v {
            "RANK" => Some("1".to_string()),
            "WORLD_SIZE" => Some("2".to_string()),
            "MASTER_ADDR" => Some("10.0.0.1".to_string()),
            _ => None,
        };
        let p = Processes::from_args(&args(&["--tp", "4"]), env).unwrap();
        assert_eq!(p.master.as_deref(), Some("10.0.0.1:29500"));
        let placed = p.placement(4);
        assert_eq!(
            (placed.world, placed.first_rank, placed.gpus),
            (4, 2, vec![0, 1])
        );
        // Flags win over the environment.
        let p = Processes::from_args(
            &args(&["--tp", "4", "--rank", "0", "--master-port", "7000"]),
            env,
        )
        .unwrap();
        assert_eq!((p.rank, p.master.as_deref()), (0, Some("10.0.0.1:7000")));
    }

    #[test]
    fn a_bad_process_layout_is_refused_with_its_fix() {
        let none = |_: &str| None;
        let err = |extra: &[&str]| {
            Processes::from_args(&args(extra), none)
                .unwrap_err()
                .to_string()
        };
        assert!(
            err(&["--tp", "3", "--world-size", "2", "--master-addr", "h"])
                .contains("not divisible by --world-size 2")
        );
        assert!(err(&["--tp", "2", "--world-size", "2"])
            .contains("--master-addr HOST or set MASTER_ADDR"));
        assert!(err(&[
            "--tp",
            "2",
            "--world-size",
            "2",
            "--rank",
            "2",
            "--master-addr",
            "h"
        ])
        .contains("ranks are 0..2"));
    }
}
