//! An agent runtime embedding toolgate: open a host from a config, show the
//! model its Tools, make calls, handle an approval, read the journal.
//!
//! `cargo run -p toolgate --example embed -- demo/toolgate.toml`
//! (after `scripts/demo` has packed the example Tools into demo/plugins).

use serde_json::json;
use toolgate::{Approval, Config, StepResult, ToolCapabilityNarrowing};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "demo/toolgate.toml".into());
    let config = Config::load(path.as_ref())?;
    // Catalog (metadata only), the agent's snapshot, the sandbox, the journal.
    let runtime = toolgate::host::open(&config, "default").await?;

    // What the model may see: identity and schema, nothing executable.
    for tool in runtime.list() {
        println!("tool {}: {}", tool.id, tool.description);
    }

    // One run = one conversation; every call goes through gate, sandbox, commit.
    let run = runtime.start_run(None, ToolCapabilityNarrowing::Configured).await?;
    let calls = [("text.upper", json!({ "text": "hello" })), ("notes", json!({ "op": "add", "note": "from embed" }))];
    for (tool, args) in calls {
        match run.call(tool, args).await? {
            StepResult::Output { content, .. } => println!("{tool} -> {content:?}"),
            StepResult::Awaiting { ticket, correlation, .. } => {
                // The model reads only the correlation id. The ticket is the
                // approver's: the runtime shows the human the exact stored call
                // in its own approval UI, and the human decides on what it
                // showed (the approval names it by its digest, so a call
                // rewritten in the journal meanwhile is not approved).
                println!("{tool} awaits approval (request {correlation})");
                let Some(call) = runtime.store().awaiting(&ticket).await? else { continue };
                println!(
                    "  a human approves {} {} (component {})",
                    call.tool_id, call.arguments, call.component_digest
                );
                let result =
                    runtime.approve(&ticket, &Approval::by_embedder("ui:demo-user", call.call_digest())).await?;
                println!("{tool} approved -> {}", result.model_text());
            }
            other => println!("{tool} -> {}", other.model_text()),
        }
    }

    // The journal: every step, committed with its verdict and outcome.
    for step in runtime.store().steps(Some(run.id())).await? {
        let by =
            step.approved_by.map(|a| format!(" (approved by {} via {})", a.principal, a.channel)).unwrap_or_default();
        println!("#{} {} [{}] {} {}{by}", step.seq, step.tool_id, step.verdict, step.outcome.as_str(), step.result);
    }
    Ok(())
}
