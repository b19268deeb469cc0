//! `end NODE`: sets the object's stage `Complete`, then waits until [`release`] says the node
//! is released.

use super::cluster::{Cluster, api_error};
use super::render::phase_text;
use super::verdict::{Release, release};
use super::{EXIT_BLOCKED, EXIT_DEADLINE, EndArgs, Failure, Outcome, error};
use k8s_openapi::api::core::v1::Node;
use node_maintenance::types::{NodeMaintenance, Stage};
use shared::api::writer::PatchKind;
use std::time::Duration;

pub(super) async fn end(cluster: &Cluster, a: &EndArgs) -> Outcome {
    let name = a.name.clone().unwrap_or_else(|| a.node.clone());
    let Some(nm) = cluster
        .get_opt::<NodeMaintenance>(&name)
        .await
        .map_err(api_error)?
    else {
        return Err(none_named(cluster, &name, &a.node).await);
    };
    if nm.spec.node_name != a.node {
        return Err(error(format!(
            "nodemaintenance/{name} is for node {}, not {}",
            nm.spec.node_name, a.node
        )));
    }
    if nm.spec.stage != Stage::Complete {
        // One field, merged into whatever is stored (no resourceVersion): the API server cannot
        // answer it with a conflict, so there is nothing for shared::api::retry::on_conflict to
        // retry.
        let patch = serde_json::json!({"spec": {"stage": Stage::Complete.as_str()}});
        cluster
            .writer
            .patch::<NodeMaintenance>("", &name, PatchKind::Merge, patch)
            .await
            .map_err(api_error)?;
    }
    println!(
        "nodemaintenance/{name}: stage Complete; waiting for {} to be released",
        a.node
    );
    wait_released(cluster, &name, a).await
}

/// Why there is nothing to end: no object `name`, naming the node's objects if it has any.
async fn none_named(cluster: &Cluster, name: &str, node: &str) -> Failure {
    let on_node: Vec<String> = match cluster.maintenances.list(&Default::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter(|nm| nm.spec.node_name == node)
            .filter_map(|nm| nm.metadata.name)
            .collect(),
        Err(e) => return api_error(e),
    };
    error(if on_node.is_empty() {
        format!("no NodeMaintenance named {name}, and none for node {node}")
    } else {
        format!(
            "no NodeMaintenance named {name}; node {node}'s: {} (use --name)",
            on_node.join(", ")
        )
    })
}

/// Reads the object and its node once a second until the node is released, `--timeout` passes
/// (a timeout too large to add is capped far away by shared::meta::clock::far_or), or another
/// maintenance is found holding it.
async fn wait_released(cluster: &Cluster, name: &str, a: &EndArgs) -> Outcome {
    let deadline = shared::meta::clock::far_or(
        tokio::time::Instant::now(),
        Duration::from_secs(a.timeout.unsigned_abs()),
    );
    loop {
        let nm = cluster
            .get_opt::<NodeMaintenance>(name)
            .await
            .map_err(api_error)?;
        let node = cluster.get_opt::<Node>(&a.node).await.map_err(api_error)?;
        match release(nm.as_ref(), node.as_ref()) {
            Release::Released { schedulable } => {
                println!(
                    "{} released{}",
                    a.node,
                    if schedulable {
                        ": schedulable"
                    } else {
                        ": still unschedulable, as it was before the maintenance"
                    }
                );
                return Ok(());
            }
            Release::NodeGone => {
                println!("{} is gone; nothing to release", a.node);
                return Ok(());
            }
            Release::Held(message) => {
                return Err((
                    EXIT_BLOCKED,
                    format!(
                        "nodemaintenance/{name} completed, but {} stays cordoned: {message}",
                        a.node
                    ),
                ));
            }
            Release::Waiting => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err((
                EXIT_DEADLINE,
                format!(
                    "{} not released within {}s (phase {}); is node-maintenance-controller running?",
                    a.node,
                    a.timeout,
                    nm.as_ref().map_or("gone", phase_text)
                ),
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
