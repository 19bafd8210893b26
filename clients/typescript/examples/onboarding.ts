// Start an onboarding run, watch it, send its documents and approve it.
import { BelayClient } from "@belay/client";

const belay = BelayClient.fromEnv(); // BELAY_ENGINE_URL, BELAY_API_KEY, BELAY_TENANT
const { run } = await belay.startRun(
  "onboarding",
  { email: "ada@example.com", name: "Ada Lovelace", plan: "pro" },
  { callerGrants: ["crm.read", "crm.write", "email.send"] },
);
for await (const event of belay.watch(run.runId)) { // resumes by itself if the engine restarts
  console.log(event.seq, event.kind);
  if (event.kind === "wait_started") {
    await belay.signal(run.runId, "documents_received", { files: ["passport.pdf"] });
  } else if (event.kind === "approval_requested") {
    await belay.approve(run.runId, "approve", { approverGrants: ["onboarding.approve"], reason: "KYC clear" });
  }
}
const done = await belay.getRun(run.runId);
console.log(done.status, JSON.stringify(done.output));
belay.close();
