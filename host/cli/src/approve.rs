//! The approver's side of the CLI: `approve`, `deny` and `journal --awaiting`.
//!
//! Owns turning a human's decision into an [`Approval`] the core verifies:
//! with `[approval] keys` configured, a decision is signed with `--key FILE`
//! (a key the agent's OS user should not be able to read); without keys, it
//! must be typed on an interactive terminal after the exact call is shown.
//! With neither, nothing is decided. Either way the decision names the record
//! shown (signed over its digest, or carrying it), so a record rewritten
//! while the human reads is not approved: an approval signed with `--key`
//! names the digest `journal --awaiting` listed (`--digest`), or is typed on
//! a terminal after the call is shown. Tickets are listed only to an
//! approver of the ask.
//!
//! Architecture invariant: nothing here prints a ticket where the model or
//! an agent's shell can read it without being an approver, and a refused
//! decision leaves the ticket pending.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use toolgate::approval::{self, ApprovalError, Approvers, Decision};
use toolgate::keys::SecretKey;
use toolgate::store::{AwaitingRecord, TicketError};
use toolgate::{Approval, Config, Runtime, StepResult};

use crate::{field, json_text};

/// Whether this process talks to a human on an interactive terminal.
fn on_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// The OS user running this process, as the journal records a terminal
/// approver: the kernel's real uid and its name in the user database, never
/// the environment (`USER=alice` names nobody).
#[cfg(unix)]
fn os_user() -> String {
    // SAFETY: getuid cannot fail and touches no memory of ours.
    let uid = unsafe { libc::getuid() };
    match user_name(uid) {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

#[cfg(not(unix))]
fn os_user() -> String {
    "unknown user".to_owned()
}

/// `uid`'s login name from the user database (`getpwuid_r`), if it has one.
#[cfg(unix)]
fn user_name(uid: libc::uid_t) -> Option<String> {
    let mut buf: Vec<libc::c_char> = vec![0; 1024];
    loop {
        // SAFETY: `pwd` and `result` are ours to fill; `buf` is as long as
        // we say; the name is read only when the call succeeded, while `buf`
        // (which holds it) is alive.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) }.to_string_lossy().into_owned();
        return (!name.is_empty()).then_some(name);
    }
}

/// The length of a call digest in hex: SHA-256, all of it.
const DIGEST_HEX: usize = 64;

/// Whether `given` (from `--digest`) is `record`'s call digest: all of it,
/// in either case. A prefix is refused: an agent that can write the journal
/// can choose two calls whose digests share any short prefix (64 bits take
/// about 2^32 hashes), show the approver one and swap in the other.
fn check_digest(record: &AwaitingRecord, given: &str) -> Result<()> {
    let given = given.trim().to_ascii_lowercase();
    if given.len() != DIGEST_HEX || !given.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "`--digest` takes the whole call digest ({DIGEST_HEX} hex characters): copy all of it from \
             `toolgate journal --awaiting`; nothing was decided and the request is still pending"
        );
    }
    if record.call_digest().hex() != given {
        return Err(ApprovalError::ChangedSinceShown { ticket: record.ticket_id.clone() }.into());
    }
    Ok(())
}

/// Ask the human at the terminal to type `word`; anything else decides nothing.
fn confirm(word: &str) -> Result<()> {
    eprint!("type `{word}` to {word} this call: ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("cannot read the confirmation")?;
    if line.trim() != word {
        bail!("not confirmed; nothing was decided and the request is still pending");
    }
    Ok(())
}

/// Whether a decider who holds approver key `public` (`None`: a human at a
/// terminal) was an approver of the ask `r` when it was asked. An ask
/// journaled before approvers were recorded can still be denied, so its
/// ticket is shown.
fn asked_of(r: &AwaitingRecord, public: Option<&str>) -> bool {
    let Some(text) = r.approvers.as_deref() else { return true };
    match (Approvers::parse(text), public) {
        (Some(set), Some(public)) => set.keys.iter().any(|k| k == public),
        (Some(set), None) => set.terminal,
        (None, _) => false,
    }
}

fn read_key(path: &Path) -> Result<SecretKey> {
    let text = toolgate::files::read_text(path, 4096)
        .with_context(|| format!("cannot read approver key {}", path.display()))?;
    SecretKey::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn when(unix: i64) -> String {
    if unix <= 0 { "unknown".to_owned() } else { format!("unix time {unix}") }
}

/// The exact call, as an approver must see it before deciding; arguments
/// holding a configured secret as a note naming the credential (stderr may
/// be a CI log).
fn show(r: &AwaitingRecord, secrets: &crate::Withhold) {
    eprintln!("request {} asks to run:", field(&r.call_id));
    eprintln!("  tool       {}", field(&r.tool_id));
    eprintln!("  arguments  {}", field(&secrets.json_text(&r.arguments)));
    eprintln!("  component  {}", r.component_digest);
    eprintln!("  asked by   agent `{}` in run {}", field(&r.agent), field(&r.run_id));
    eprintln!("  asked at   {}; expires at {}", when(r.requested_at), when(r.expires_at));
    eprintln!("  asked of   {}", asked_of_text(r));
    eprintln!("  digest     {}", r.call_digest().hex());
}

/// Who the ask was asked of, for a human.
fn asked_of_text(r: &AwaitingRecord) -> String {
    match r.approvers.as_deref().map(Approvers::parse) {
        Some(Some(set)) => field(&set.describe()).into_owned(),
        Some(None) => "unreadable approvers (nobody can approve it)".to_owned(),
        None => "not recorded (asked before toolgate recorded approvers: it can be denied, not approved)".to_owned(),
    }
}

/// Decide `ticket` as the human running this command; returns the result
/// the runtime committed. `digest` (`--digest`): the call digest the
/// approver was shown by `journal --awaiting`; an approval signed with a key
/// needs it, or a confirmation typed on a terminal after the call is shown.
pub async fn decide(
    config: &Config,
    runtime: &Runtime,
    ticket: &str,
    key: Option<&Path>,
    digest: Option<&str>,
    decision: Decision,
) -> Result<StepResult> {
    let record = runtime.store().awaiting(ticket).await?.ok_or_else(|| TicketError::Unknown(ticket.to_owned()))?;
    if record.state != "pending" {
        return Err(TicketError::Used(ticket.to_owned()).into());
    }
    show(&record, &crate::Withhold::configured(config));
    if matches!(decision, Decision::Approve) {
        // Asked before the human confirms or signs. The approved call runs
        // in this process, which may lack a credential the host that asked
        // has (a shell without `toolgate serve`'s environment): a call that
        // would or may run failed closed here is not put to them at all —
        // approving it from the host's environment runs it whole.
        if let Some(fails) = runtime.fails_closed_here(&record).await? {
            return Err(toolgate::runtime::unreadable(&record, fails.why().to_owned()).into());
        }
    }
    let word = match decision {
        Decision::Approve => "approve",
        Decision::Deny { .. } => "deny",
    };
    // The approval names the record the approver saw: refused, before
    // anything is signed or claimed, when it is not the one read here.
    if let (Decision::Approve, Some(d)) = (&decision, digest) {
        check_digest(&record, d)?;
    }
    let approval = match key {
        Some(path) => {
            let key = read_key(path)?;
            if matches!(decision, Decision::Approve) && digest.is_none() {
                if !on_terminal() {
                    bail!(
                        "an approval signed with `--key` names the call it approves: pass `--digest HEX`, the \
                         digest `toolgate journal --awaiting` listed for this request (or run this on an interactive \
                         terminal and confirm the call shown); nothing was decided and the request is still pending"
                    );
                }
                confirm(word)?;
            }
            // What is signed is the record shown above (and checked
            // against `--digest`): a record rewritten since does not verify.
            Approval::signed(approval::sign(&key, &record, &decision))
        }
        None if !config.approvers.is_empty() => {
            bail!(
                "`[approval] keys` are configured, so a decision must be signed: pass `--key FILE` with an approver key"
            )
        }
        None if !on_terminal() => bail!(
            "deciding a ticket needs an approver, and this is not an interactive terminal; configure \
             `[approval] keys` (from `toolgate keygen --for approval`) and pass `--key FILE`, or run this on a terminal"
        ),
        None => {
            confirm(word)?;
            // The human decided on the record shown above: a journal writer
            // that rewrites it while they read gets the approval refused.
            Approval::on_terminal(os_user(), record.call_digest())
        }
    };
    let result = match &decision {
        Decision::Approve => runtime.approve(ticket, &approval).await?,
        Decision::Deny { reason } => runtime.deny(ticket, reason, &approval).await?,
    };
    Ok(result)
}

/// `journal --awaiting`: pending requests, each with its call digest (what
/// `approve --digest` names); their tickets only to an approver of the ask
/// (a key listed in `[approval] keys` and asked of, or a terminal when no
/// keys are configured and none were when it was asked). Arguments holding
/// a configured secret are shown as a note naming the credential (the
/// digest is still the stored call's).
pub async fn list_pending(
    config: &Config,
    store: &dyn toolgate::store::StepStore,
    key: Option<&Path>,
    secrets: &crate::Withhold,
    as_json: bool,
) -> Result<()> {
    let approver = match key {
        Some(path) => {
            let public = read_key(path)?.public();
            if !config.approvers.contains(&public) {
                bail!("{} is not an approver key: its public key {public} is not in `[approval] keys`", path.display());
            }
            Some(Some(public))
        }
        None => (config.approvers.is_empty() && on_terminal()).then_some(None),
    };
    let pending = store.pending().await?;
    for a in &pending {
        let ticket = approver.as_ref().filter(|p| asked_of(a, p.as_deref())).map(|_| a.ticket_id.as_str());
        let digest = a.call_digest().hex();
        let arguments = secrets.json_text(&a.arguments);
        if as_json {
            let mut v = json!({
                "request": a.call_id, "run": a.run_id, "agent": a.agent, "tool": a.tool_id,
                "arguments": arguments, "component": a.component_digest.to_string(),
                "requested_at": a.requested_at, "expires_at": a.expires_at, "digest": digest,
                "asked_of": a.approvers.as_deref().and_then(Approvers::parse),
            });
            if let Some(t) = ticket {
                v["ticket"] = json!(t);
            }
            println!("{}", json_text(&v)?);
        } else {
            println!(
                "{}  {} {}  (agent {}, run {})  digest {}{}",
                field(&a.call_id),
                field(&a.tool_id),
                field(&arguments),
                field(&a.agent),
                field(&a.run_id),
                digest,
                ticket.map(|t| format!("  ticket {t}")).unwrap_or_default()
            );
        }
    }
    let hidden = pending.iter().filter(|a| approver.as_ref().is_some_and(|p| !asked_of(a, p.as_deref()))).count();
    if hidden > 0 {
        eprintln!(
            "toolgate: {hidden} request(s) were asked of other approvers (see `asked of` with `toolgate approve`); \
             their tickets are not shown: only an approver in force when a call asked decides it"
        );
    }
    if approver.is_none() && !pending.is_empty() {
        eprintln!(
            "toolgate: tickets are shown to approvers only: pass `--key FILE` (a key in `[approval] keys`){}",
            if config.approvers.is_empty() { ", or run this on a terminal" } else { "" }
        );
    }
    Ok(())
}
