//! `dce`: removes nodes whose values nobody reads, and caches nobody reads.
//!
//! Function arguments stay. A cache write (`cache.update`) is an effect, kept while any
//! function reads that cache back (any `cache.update` of the same state has a user); a cache
//! no function reads is dead state, so its writes and its declaration go too. That is how the
//! indexer's key cache disappears once dense attention no longer consults the indexer.

use std::collections::HashSet;

use glmc_ir::{Module, Op};
use petgraph::Direction;

use crate::pass::{Pass, PassError};

pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, module: &mut Module) -> Result<bool, PassError> {
        Ok(eliminate_dead_code(module))
    }
}

/// Removes dead nodes and dead cache states; returns whether anything was removed.
pub fn eliminate_dead_code(module: &mut Module) -> bool {
    let mut changed = false;
    loop {
        let read = read_states(module);
        let mut removed = false;
        for f in &mut module.functions {
            let results: HashSet<_> = f.results.iter().map(|(_, v)| v.node).collect();
            // Consumers come after producers in canonical order, so one reverse sweep frees
            // whole dead chains.
            for n in f.canonical_order().into_iter().rev() {
                let node = f.node(n);
                let states = node.op.cache_states();
                let live = matches!(node.op, Op::Input { .. })
                    || states.iter().any(|s| read.contains(s))
                    || results.contains(&n)
                    || f.graph
                        .neighbors_directed(n, Direction::Outgoing)
                        .next()
                        .is_some();
                if !live {
                    f.graph.remove_node(n);
                    removed = true;
                }
            }
        }
        let before = module.states.len();
        module.states.retain(|state, _| read.contains(state));
        removed |= module.states.len() != before;
        if !removed {
            return changed;
        }
        changed = true;
    }
}

/// States that some function reads back.
fn read_states(module: &Module) -> HashSet<String> {
    let mut read = HashSet::new();
    for f in &module.functions {
        for n in f.graph.node_indices() {
            // A node writing several states stays whole while any of them is read, so all of
            // them stay declared.
            let states = f.node(n).op.cache_states();
            if !states.is_empty()
                && f.graph
                    .neighbors_directed(n, Direction::Outgoing)
                    .next()
                    .is_some()
            {
                read.extend(states.iter().cloned());
            }
        }
    }
    read
}
