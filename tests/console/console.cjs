// The operator console in a real browser (Debian's Chromium, driven by
// playwright-core; accessibility checked with axe-core). Run by
// tests/tests/console.rs against a real engine, worker and CRM double,
// which set the environment below and check the runs' histories after.
// Prints one line per check; exits non-zero on the first failure, with a
// screenshot of the page it failed on (failure.png).
"use strict";

const fs = require("fs");
const path = require("path");

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`console.cjs: ${name} is not set`);
    process.exit(2);
  }
  return v;
}

const M = need("BELAY_CONSOLE_NODE_MODULES");
const CHROMIUM = need("BELAY_CHROMIUM");
const BASE = need("BELAY_CONSOLE_URL");
const SHOTS = need("BELAY_SCREENSHOTS");
const KEYS = {
  operator: need("BELAY_KEY_OPERATOR"),
  approver: need("BELAY_KEY_APPROVER"),
  viewer: need("BELAY_KEY_VIEWER"),
  stranger: need("BELAY_KEY_STRANGER"),
};
const LOST = need("BELAY_RUN_LOST");
const WAITING = need("BELAY_RUN_WAITING");
const UNCERTAIN = need("BELAY_UNCERTAIN_ID");
const ACCOUNT = need("BELAY_ACCOUNT_ID");

const { chromium } = require(path.join(M, "playwright-core"));
const AXE = fs.readFileSync(path.join(M, "axe-core", "axe.min.js"), "utf8");

let checks = 0;
function ok(what) {
  checks += 1;
  console.log(`ok ${checks} - ${what}`);
}
function expect(cond, what) {
  if (!cond) throw new Error(`failed: ${what}`);
  ok(what);
}

const cspErrors = [];

async function axe(page, name) {
  await page.evaluate(AXE);
  const result = await page.evaluate(() =>
    // eslint-disable-next-line no-undef
    axe.run(document, { resultTypes: ["violations"] })
  );
  const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  if (bad.length) {
    const text = bad
      .map((v) => `${v.impact} ${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(" ")).join("; ")})`)
      .join("\n");
    throw new Error(`axe-core on ${name}:\n${text}`);
  }
  ok(`${name}: axe-core passed ${result.passes.length} rules; no serious or critical violation (${result.violations.length} minor)`);
}

async function shot(page, name) {
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: false });
  ok(`screenshot ${file}`);
}

async function signIn(page, who, tenant) {
  await page.goto(`${BASE}/console/login`);
  await page.getByLabel("API key").fill(KEYS[who]);
  await page.getByLabel("Tenant").fill(tenant);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(`**/console/t/${tenant}/runs`);
  ok(`${who} signed in to ${tenant}`);
}

async function signOut(page) {
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL("**/console/login");
}

const acme = `${BASE}/console/t/acme`;

// POST a urlencoded form from the page itself (same origin, with its
// session cookie), as a script on a console page could; the status.
async function post(page, url, fields) {
  return page.evaluate(
    async ([u, f]) => {
      const r = await fetch(u, {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams(f).toString(),
        redirect: "manual",
      });
      return r.status;
    },
    [url, fields]
  );
}

async function viewerSeesButCannotResolve(page) {
  await signIn(page, "viewer", "acme");
  await page.locator(`tr[data-run-id="${LOST}"]`).waitFor();
  expect(await page.locator(`tr[data-run-id="${WAITING}"]`).count() === 1, "a viewer of acme sees acme's runs");
  expect(await page.getByRole("link", { name: "Uncertain outcomes" }).count() === 0, "a viewer has no queue link");
  const queue = await page.goto(`${acme}/uncertain`);
  expect(queue.status() === 403, "a viewer is refused the uncertain queue (403)");
  await page.goto(`${acme}/runs`);
  const csrf = await page.locator('input[name="csrf"]').first().inputValue();
  const status = await post(page, `${acme}/uncertain/${UNCERTAIN}/resolve`, {
    csrf,
    resolution: "retry",
    reason: "a viewer tries",
  });
  expect(status === 403, "a viewer cannot resolve, even with its own CSRF token (403)");
  await signOut(page);
}

async function strangerSeesNothing(page) {
  await signIn(page, "stranger", "globex");
  const html = await page.content();
  expect(html.includes("No runs match.") && !html.includes(LOST) && !html.includes(WAITING), "another tenant's viewer sees no run of acme");
  for (const url of [`${acme}/runs`, `${acme}/runs/${LOST}`, `${acme}/approvals`, `${acme}/definitions`]) {
    const r = await page.goto(url);
    const body = await page.content();
    expect(r.status() === 403 && !body.includes(LOST), `another tenant's viewer is refused ${url.slice(BASE.length)} (403)`);
  }
  await page.goto(`${BASE}/console/t/globex/approvals`);
  expect((await page.content()).includes("Nothing is waiting on a person."), "another tenant's viewer sees no approval of acme");
  await page.goto(`${BASE}/console/t/globex/runs`);
  await signOut(page);
}

async function keyboard(page) {
  await page.keyboard.press("Tab");
  const first = await page.evaluate(() => document.activeElement && document.activeElement.textContent.trim());
  expect(first === "Skip to content", "the first Tab reaches the skip link");
  await page.keyboard.press("Enter");
  await page.keyboard.press("Tab");
  const next = await page.evaluate(() => document.activeElement && document.activeElement.id);
  expect(next === "f-status", "after skipping, Tab reaches the first filter");
}

async function operatorResolves(page) {
  await signIn(page, "operator", "acme");
  await page.locator(`tr[data-run-id="${LOST}"]`).waitFor();
  await keyboard(page);
  await axe(page, "runs");
  await shot(page, "runs");
  await page.getByLabel("Status", { exact: true }).selectOption("paused");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL("**/runs?status=paused**");
  expect(await page.locator("tr[data-run-id]").count() === 1 && await page.locator(`tr[data-run-id="${LOST}"]`).count() === 1, "the status filter shows only the paused run");

  await page.getByRole("link", { name: "Uncertain outcomes" }).click();
  const card = page.locator(`article[data-uncertain="${UNCERTAIN}"]`);
  await card.waitFor();
  const args = await card.locator("[data-arguments]").textContent();
  expect(args.includes("ui@example.com"), "the queue shows the exact arguments sent");
  expect((await card.locator("[data-key]").textContent()).trim() === `${LOST}/intake.t2`, "the queue shows the idempotency key");
  expect((await card.textContent()).includes("reconcile"), "the queue shows the repeat safety");
  await axe(page, "uncertain outcomes");
  await shot(page, "uncertain");
  await card.getByLabel("It succeeded").check();
  await card.getByLabel(/^Result/).fill(JSON.stringify({ account_id: ACCOUNT }));
  await card.getByLabel(/^Reason/).fill("the account exists in the CRM");
  await card.getByRole("button", { name: "Resolve" }).click();
  await page.getByText("The uncertain outcome was resolved.").waitFor();
  const audit = await page.locator("table[aria-labelledby=audit]").textContent();
  expect(audit.includes("operator") && audit.includes("the account exists in the CRM"), "the audit names who resolved and why");

  await page.goto(`${acme}/runs/${LOST}`);
  await page.locator('[data-status="completed"]').waitFor({ timeout: 30000 });
  ok("the resolved run completes (seen by the page's live update)");
  await shot(page, "run-completed");
  const call = page.locator('[data-call="intake.t2"]');
  const callText = await call.textContent();
  expect(callText.includes("reconcile") && callText.includes(`${LOST}/intake.t2`) && callText.includes("lease expired") && callText.includes("uncertain_outcome_resolved"), "the timeline shows the call's repeat safety, key, attempts and resolution");
  await page.locator("#h-timeline").scrollIntoViewIfNeeded();
  await page.evaluate(() => window.scrollBy(0, document.querySelector("#h-timeline").getBoundingClientRect().top - 10));
  await shot(page, "run-timeline");
}

async function csrfRefused(page) {
  const pause = `${acme}/runs/${WAITING}/pause`;
  let status = await post(page, pause, { reason: "no token" });
  expect(status === 403, "a form without the CSRF token is refused (403)");
  status = await post(page, pause, { reason: "wrong token", csrf: "0".repeat(64) });
  expect(status === 403, "a form with another CSRF token is refused (403)");
  // A page of another site posting to the console: the browser sends no
  // SameSite=Strict cookie, so it acts for no one.
  const other = await page.context().newPage();
  await other.setContent(`<form method="post" action="${pause}"><input name="reason" value="cross-site"></form>`);
  const [nav] = await Promise.all([
    other.waitForNavigation(),
    other.evaluate(() => document.forms[0].submit()),
  ]);
  expect(nav.status() === 401, "a cross-site form carries no session (401)");
  await other.close();
}

async function operatorSignals(page) {
  await page.goto(`${acme}/runs/${WAITING}`);
  await page.getByLabel("Signal", { exact: true }).selectOption("documents_received");
  await page.getByLabel("Payload (JSON)").fill(JSON.stringify({ files: ["passport.pdf", "utility_bill.pdf"] }));
  await page.getByRole("button", { name: "Send signal" }).click();
  await page.getByText("The signal was delivered.").waitFor();
  await page.locator('[data-reason]', { hasText: "onboarding.approve" }).waitFor({ timeout: 30000 });
  ok("after the signal the run waits for an approver (live update)");
  await page.locator('g.g-node.current[data-node="approve"]').waitFor();
  ok("the graph highlights the approval node");
  await axe(page, "run");
  await shot(page, "run");
  await signOut(page);
}

async function approverDecides(page) {
  await signIn(page, "approver", "acme");
  await page.getByRole("link", { name: "Waiting on people" }).click();
  const card = page.locator(`article[data-waiting="approval"][data-run="${WAITING}"]`);
  await card.waitFor();
  const subject = JSON.parse(await card.getByLabel(/^Subject/).inputValue());
  expect(subject.plan === "pro" && /^acct_/.test(subject.account_id), "the approval shows its subject");
  expect((await card.textContent()).includes("Open account"), "the approval shows its prompt");
  await axe(page, "approvals");
  await shot(page, "approvals");
  subject.plan = "enterprise";
  await card.getByLabel(/^Subject/).fill(JSON.stringify(subject, null, 2));
  await card.getByLabel("Reason").fill("KYC is clear; enterprise as agreed");
  await card.getByRole("button", { name: "Approve" }).click();
  await page.getByText("Approved.").waitFor();
  expect(await page.locator(`article[data-run="${WAITING}"]`).count() === 0, "the decided approval leaves the list");
}

async function definitions(page) {
  await page.getByRole("link", { name: "Definitions" }).click();
  const row = page.locator('tr[data-tool="create_account"]');
  const text = await row.textContent();
  expect(text.includes("create_account(email: string") && text.includes("-> {account_id: string}"), "the tool's signature");
  expect(text.includes("crm.write") && text.includes("reconcile") && text.includes("find_account_by_key"), "the tool's permission and repeat safety");
  await page.locator("details#wf-onboarding-1 > summary").click();
  expect(await page.locator('details#wf-onboarding-1 g.g-node[data-node="approve"]').count() === 1, "a workflow's graph");
  await axe(page, "definitions");
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot(page, "definitions");
}

(async () => {
  fs.mkdirSync(SHOTS, { recursive: true });
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.setDefaultTimeout(20000);
  page.on("console", (m) => {
    if (m.type() === "error" && /Content Security Policy/i.test(m.text())) cspErrors.push(m.text());
  });
  try {
    await page.goto(`${BASE}/console/login`);
    await axe(page, "login");
    await shot(page, "login");
    await viewerSeesButCannotResolve(page);
    await strangerSeesNothing(page);
    await operatorResolves(page);
    await csrfRefused(page);
    await operatorSignals(page);
    await approverDecides(page);
    await definitions(page);
    expect(cspErrors.length === 0, `no page broke its own Content-Security-Policy ${cspErrors.join("; ")}`);
    console.log(`${checks} passed, 0 failed`);
  } catch (e) {
    console.error(e && e.stack ? e.stack : String(e));
    try {
      await page.screenshot({ path: path.join(SHOTS, "failure.png") });
      console.error(`page at failure: ${page.url()} (${path.join(SHOTS, "failure.png")})`);
    } catch (_) {
      /* the page is gone */
    }
    await browser.close();
    process.exit(1);
  }
  await browser.close();
})();
