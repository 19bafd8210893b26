"""Start an onboarding run, watch it, send its documents and approve it."""
from belay_client import Client

with Client.from_env() as belay:  # BELAY_ENGINE_URL, BELAY_API_KEY, BELAY_TENANT
    run = belay.start_run(
        "onboarding",
        {"email": "ada@example.com", "name": "Ada Lovelace", "plan": "pro"},
        caller_grants=["crm.read", "crm.write", "email.send"],
    ).run
    for event in belay.watch(run.run_id):  # resumes by itself if the engine restarts
        print(event.seq, event.kind)
        if event.kind == "wait_started":
            belay.signal(run.run_id, "documents_received", {"files": ["passport.pdf"]})
        elif event.kind == "approval_requested":
            belay.approve(run.run_id, "approve", approver_grants=["onboarding.approve"], reason="KYC clear")
    done = belay.get_run(run.run_id)
    print(done.status, done.output)
