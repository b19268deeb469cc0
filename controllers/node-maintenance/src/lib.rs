//! node-maintenance-controller: declarative, PDB-aware node drains (spec §4-§7).

pub mod cli;
pub mod types;

use shared::controller::{Controller, Declaration, InitError, Registration, Setup};

pub const DECLARATION: Declaration = Declaration {
    name: "node-maintenance-controller",
    aliases: &[],
    event_source: "node-maintenance-controller",
    // It needs the NodeMaintenance CRD installed: operators enable it by name.
    on_by_default: false,
};
pub const NAME: &str = DECLARATION.name;

#[derive(clap::Args, Clone, Debug)]
pub struct Options {
    /// Pilothouse (NM-23): patch the node's KEP-5683 conditions (MaintenanceInProgress, DrainInProgress, Drained) while a NodeMaintenance acts on it.
    #[arg(long, default_value_t = false)]
    pub nodemaintenance_node_lifecycle_conditions: bool,
    /// The number of NodeMaintenance objects that are allowed to sync concurrently.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub concurrent_nodemaintenance_syncs: u32,
}

pub fn registration(opts: Options) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(setup, opts)))
}

pub fn init(setup: Setup, _opts: Options) -> Result<Box<dyn Controller>, InitError> {
    Ok(setup.wiring().build())
}
