//! Tenant isolation: every RPC of every `belay.v1` service (listed from the
//! service descriptors, so a new RPC without a case fails here) and every
//! admin route (listed from `admin::ROUTES`) is called, against a real
//! engine on 127.0.0.1, as: no key, a malformed key, a revoked key, an
//! expired key, a key of another tenant and a key of the wrong role. Each
//! gets `UNAUTHENTICATED` or `PERMISSION_DENIED` (401 or 403), and the
//! database is the same afterwards, row for row.

mod access_harness;
mod common;

use access_harness::{Case, Fixture};
use common::Backend;

/// Every RPC as every wrong principal: refused, nothing changed.
async fn every_rpc_refuses_the_wrong_principal(backend: Backend) {
    let f = Fixture::start(backend).await;
    let before = f.snapshot().await;
    let methods = access_harness::grpc_methods();
    assert!(
        methods.len() >= 20,
        "descriptors list {} methods",
        methods.len()
    );
    for (service, method, streaming) in &methods {
        let body = f.request_for(method);
        let roles = access_harness::admitted(service, method);
        for case in Case::ALL {
            let Some(want) = f.expected_grpc(service, method, case) else {
                continue;
            };
            for (i, key) in f.credentials(case, roles).iter().enumerate() {
                let got = f
                    .call(service, method, *streaming, &body, key.as_deref())
                    .await;
                let what = format!("{service}/{method} as {case:?} #{i}");
                assert_eq!(got, Err(want.grpc()), "{what}: expected {want:?}");
                access_harness::assert_same(&before, &f.snapshot().await, &what);
            }
        }
    }
    f.stop().await;
}

/// Every admin route as every wrong principal: 401 or 403, nothing changed.
async fn every_admin_route_refuses_the_wrong_principal(backend: Backend) {
    let f = Fixture::start(backend).await;
    let before = f.snapshot().await;
    for (method, template) in belay_engine::admin::ROUTES {
        if belay_engine::admin::PUBLIC_ROUTES.contains(template) {
            continue;
        }
        for case in Case::ALL {
            let Some(want) = f.expected_admin(template, case) else {
                continue;
            };
            for (i, key) in f.admin_credentials(case).iter().enumerate() {
                let status = f.admin_call(method, template, key.as_deref()).await;
                let what = format!("{method} {template} as {case:?} #{i}");
                assert_eq!(status, want.http(), "{what}: expected {want:?}");
                access_harness::assert_same(&before, &f.snapshot().await, &what);
            }
        }
    }
    f.stop().await;
}

/// A worker key of another tenant claims nothing of this tenant's, and
/// an operator lists only its own tenant's keys.
async fn what_another_tenant_may_call_shows_nothing_of_this_one(backend: Backend) {
    let f = Fixture::start(backend).await;
    assert!(
        f.claim_as(Case::OtherTenant).await.is_empty(),
        "a worker of tenant b claimed a task of tenant a"
    );
    let listed = f.list_keys_as_other_operator().await;
    assert!(
        listed.iter().all(|tenants| tenants == &["b".to_owned()]),
        "tenant b's operator saw {listed:?}"
    );
    f.stop().await;
}

on_both_backends!(
    every_rpc_refuses_the_wrong_principal,
    every_admin_route_refuses_the_wrong_principal,
    what_another_tenant_may_call_shows_nothing_of_this_one,
);
