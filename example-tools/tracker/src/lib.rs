//! An HTTP tool with a credential: lists issues from an issue-tracker style
//! JSON API. The credential is a *reference* (`tracker`): the host applies the
//! secret as the request leaves, only towards destinations bound to it.
//!
//! It declares `http://127.0.0.1:*` and `https://*.tracker.example:443` so the
//! host may grant either a local tracker or a hosted one; the host's grant
//! picks the exact destination.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgate_sdk::http::Request;
use toolgate_sdk::{Annotations, Context, DeclaredCapabilities, Tool, ToolError};

/// Arguments of `tracker.issues`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesArgs {
    /// Base URL of the tracker API, e.g. `https://acme.tracker.example`.
    pub base_url: String,
    /// `open` or `closed`; default `open`.
    #[serde(default)]
    pub state: Option<String>,
}

/// One issue.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct Issue {
    /// Number.
    pub id: u64,
    /// Title.
    pub title: String,
    /// `open` or `closed`.
    pub state: String,
}

/// `tracker.issues`: list issues.
pub struct Issues;
impl Tool for Issues {
    const ID: &'static str = "tracker.issues";
    const DESCRIPTION: &'static str = "List the issues of the tracker, filtered by state.";
    const PRIMARY_ARGUMENT: Option<&'static str> = Some("base_url");
    type Args = IssuesArgs;
    type Output = Vec<Issue>;
    fn capabilities() -> DeclaredCapabilities {
        DeclaredCapabilities::none()
            .host("http://127.0.0.1:*")
            .host("https://*.tracker.example:443")
            .credential("tracker")
    }
    fn annotations() -> Annotations {
        Annotations { read_only: Some(true), open_world: Some(true), ..Default::default() }
    }
    fn call(args: IssuesArgs, _cx: &mut Context<'_>) -> Result<Vec<Issue>, ToolError> {
        let state = args.state.as_deref().unwrap_or("open");
        if !state.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(ToolError::InvalidArguments("`state` must be a word such as open or closed".into()));
        }
        let url = format!("{}/issues?state={state}", args.base_url.trim_end_matches('/'));
        let response = Request::get(&url).header("accept", "application/json").credential("tracker").send()?;
        if response.status != 200 {
            return Err(ToolError::failed(format!("the tracker answered {}: {}", response.status, response.text())));
        }
        Ok(response.json()?)
    }
}

toolgate_sdk::export_tools!(Issues);
