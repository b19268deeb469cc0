//! `status [NODE]`: the objects (all, or those of NODE) as a table, with what blocks them.

use super::cluster::{Cluster, api_error};
use super::render::status_text;
use super::{Outcome, StatusArgs};
use k8s_openapi::jiff::Timestamp;

pub(super) async fn status(cluster: &Cluster, a: &StatusArgs) -> Outcome {
    let mut items = cluster
        .maintenances
        .list(&Default::default())
        .await
        .map_err(api_error)?
        .items;
    if let Some(node) = &a.node {
        items.retain(|nm| &nm.spec.node_name == node);
    }
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    print!("{}", status_text(&items, Timestamp::now()));
    Ok(())
}
