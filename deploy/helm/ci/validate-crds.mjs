// Validates the custom resources of a rendered chart that
// kubernetes-validate has no schema for (prometheus-operator's
// ServiceMonitor), against the CRD schemas shipped in the npm package
// @kubernetes-models/prometheus-operator. Reads YAML documents on stdin;
// prints each resource checked and exits 1 naming the first invalid one.
// Run by .ci/helm.sh with NODE_PATH at its npm cache.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

// The packages are ESM-only and live outside the repository: import them
// by file URL under NODE_PATH.
const modules = process.env.NODE_PATH;
const load = (path) => import(pathToFileURL(`${modules}/${path}`).href);
const YAML = await load("yaml/dist/index.js");
const kinds = {
  "monitoring.coreos.com/v1/ServiceMonitor":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js",
};

let checked = 0;
for (const doc of YAML.parseAllDocuments(readFileSync(0, "utf8"))) {
  const resource = doc.toJS();
  if (!resource) continue;
  const path = kinds[`${resource.apiVersion}/${resource.kind}`];
  if (!path) continue;
  const Model = (await load(path))[resource.kind];
  try {
    new Model(resource).validate();
  } catch (e) {
    console.error(`INVALID ${resource.kind}/${resource.metadata?.name}: ${e.message}`);
    process.exit(1);
  }
  console.log(`passed ${resource.kind}/${resource.metadata.name} (${resource.apiVersion})`);
  checked++;
}
if (process.argv.includes("--expect-some") && checked === 0) {
  console.error("no custom resource found to validate");
  process.exit(1);
}
