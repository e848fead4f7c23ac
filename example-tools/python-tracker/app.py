"""An HTTP tool with a credential, in Python: lists issues from an
issue-tracker style JSON API. The credential is a *reference* (`tracker`): the
host applies the secret as the request leaves, only towards destinations bound
to it; the Tool never sees it. The same Tool as the Rust `tracker` example."""

from dataclasses import dataclass
from typing import Optional

from toolgate_sdk import Annotations, Capabilities, Context, Failed, InvalidArguments, Tool, export_tools
from toolgate_sdk.http import Request


@dataclass
class IssuesArgs:
    """Arguments of `tracker.issues`.

    Attributes:
        base_url: Base URL of the tracker API, e.g. `https://acme.tracker.example`.
        state: `open` or `closed`; default `open`.
    """

    base_url: str
    state: Optional[str] = None


@dataclass
class Issue:
    """One issue.

    Attributes:
        id: Number.
        title: Title.
        state: `open` or `closed`.
    """

    id: int
    title: str
    state: str


class Issues(Tool):
    ID = "tracker.issues"
    DESCRIPTION = "List the issues of the tracker, filtered by state."
    PRIMARY_ARGUMENT = "base_url"
    CAPABILITIES = (
        Capabilities().host("http://127.0.0.1:*").host("https://*.tracker.example:443").credential("tracker")
    )
    ANNOTATIONS = Annotations(read_only=True, open_world=True)

    def call(self, args: IssuesArgs, cx: Context) -> list[Issue]:
        state = args.state or "open"
        if not state.isascii() or not state.isalpha():
            raise InvalidArguments("`state` must be a word such as open or closed")
        url = f"{args.base_url.rstrip('/')}/issues?state={state}"
        response = Request.get(url).header("accept", "application/json").credential("tracker").send()
        if response.status != 200:
            raise Failed(f"the tracker answered {response.status}: {response.text()}")
        return [Issue(i["id"], i["title"], i["state"]) for i in response.json()]


export_tools(Issues)
