// Node 20 lacks Promise.withResolvers (Node 22 has it); restate-sdk 1.17
// calls it. Imported before the SDK.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve;
    let reject;
    const promise = new this((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
