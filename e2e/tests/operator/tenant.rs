//! k. Tenants (multi-tenant safety): two namespaces, A and B, each with its own S3 user whose
//!    bucket policy allows only that namespace's folder, `<prefix>/v1/jobs/<namespace>/`, given
//!    to its sidecars through the namespace's `cojob-store-credentials` Secret. Both jobs run
//!    with these scoped credentials, and every attack of a tenant of A is refused or harmless:
//!
//! - **read the controller's credentials**: the run's holder Secret carries the holder and the
//!   store's endpoint and region, no secret-looking variable;
//! - **forge B's decisions** with A's credentials: reading or writing B's lease, or claiming a
//!   tick of B, is `AccessDenied` (while A's own folder is readable: the refusal is the
//!   policy, not a broken client);
//! - **run pods through the controller** with only `create coordinatedjobs`: the admission
//!   policy refuses the CoordinatedJob (the requester may not create pods); granted pods, the
//!   same request is admitted;
//! - **a leaked controller token**: the controller's account can neither read a Secret (RBAC:
//!   its only Secret verb is `create`) nor create one that is not a run pod's holder Secret,
//!   such as a service-account token (admission policy);
//! - **an oversized document** planted with A's credentials (in A's own folder, the only one
//!   they reach) stops A's job (`InvalidStoreDocument`) and no other: B's next job runs;
//! - **the default roles**: `view` may read CoordinatedJobs but not create one.

use super::*;
use cojob::store::ObjectStoreBackend;
use cojob::{PutMode, StoreError};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use object_store::ObjectStoreExt as _;

/// An S3 user of the test server, allowed only its namespace's folder.
struct Tenant {
    namespace: String,
    access: String,
    secret: String,
}

pub async fn tenants(ctx: Arc<Ctx>, ns: String) -> anyhow::Result<()> {
    let other = TestNamespace::create(&ctx.client, "op-tenant-b").await;
    let result = attacks(&ctx, &ns, &other.name).await;
    let _ = coordinated_jobs(&ctx.client, &other.name)
        .delete("work", &DeleteParams::default())
        .await;
    other.cleanup().await;
    result
}

async fn attacks(ctx: &Ctx, a_ns: &str, b_ns: &str) -> anyhow::Result<()> {
    let (bucket, prefix) = bucket_and_prefix(&ctx.bucket)?;
    let a = tenant(a_ns).await?;
    let b = tenant(b_ns).await?;
    put_bucket_policy(&bucket, &prefix, &[&a, &b]).await?;
    for t in [&a, &b] {
        give_credentials(ctx, t).await?;
    }

    // Both jobs run with scoped credentials only.
    let mut leases = BTreeMap::new();
    for t in [&a, &b] {
        create_job(
            ctx,
            &t.namespace,
            "work",
            spec("echo tenant work", json!({})),
        )
        .await?;
        let uid = job_uid(ctx, &t.namespace, "work").await?;
        let lease = terminal_once_lease(
            ctx,
            &t.namespace,
            "work",
            &uid,
            "a tenant's run to end",
            Duration::from_secs(90),
        )
        .await?;
        ensure!(
            lease.status() == Some("succeeded"),
            "{}: the run with scoped credentials did not succeed: {}",
            t.namespace,
            lease.state
        );
        leases.insert(t.namespace.clone(), uid);
    }

    // The run's Secret holds no credential of the controller.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), a_ns);
    let holder = secrets
        .list(&ListParams::default().labels("cojob.dev/run=work-once"))
        .await?
        .items
        .into_iter()
        .next()
        .context("the run's holder Secret")?;
    let keys: Vec<String> = holder.data.unwrap_or_default().into_keys().collect();
    let secret_looking: Vec<&String> = keys
        .iter()
        .filter(|k| *k != "holder" && cojob_controller_looks_secret(k))
        .collect();
    ensure!(
        secret_looking.is_empty() && keys.iter().any(|k| k == "AWS_ENDPOINT_URL"),
        "the holder Secret forwards {keys:?}"
    );

    // A's credentials cannot read or write B's folder; they can read A's own.
    let as_a = scoped_store(&bucket, &prefix, &a)?;
    let a_lease = format!("v1/jobs/{a_ns}/work/{}/runs/work-once/lease", leases[a_ns]);
    let b_lease = format!("v1/jobs/{b_ns}/work/{}/runs/work-once/lease", leases[b_ns]);
    let b_tick = format!("v1/jobs/{b_ns}/work/{}/ticks/once", leases[b_ns]);
    ensure!(
        as_a.get(&a_lease).await?.is_some(),
        "A's credentials cannot read A's own lease"
    );
    let read_b = as_a.get(&b_lease).await;
    ensure!(
        matches!(read_b, Err(StoreError::AccessDenied { .. })),
        "A read B's lease: {read_b:?}"
    );
    let forged = json!({"deadline_at": "2099-01-01T00:00:00.000000Z", "epoch": 99, "holder": "a",
        "state": {"status": "failed"}});
    let write_b = as_a
        .put(
            &b_lease,
            serde_json::to_vec(&forged)?.into(),
            PutMode::Overwrite,
        )
        .await;
    ensure!(
        matches!(write_b, Err(StoreError::AccessDenied { .. })),
        "A overwrote B's lease: {write_b:?}"
    );
    let claim_b = as_a
        .put(
            &format!("{b_tick}-forged"),
            b"{}".to_vec().into(),
            PutMode::IfAbsent,
        )
        .await;
    ensure!(
        matches!(claim_b, Err(StoreError::AccessDenied { .. })),
        "A claimed a tick of B: {claim_b:?}"
    );
    let b_state = ctx.store.get(&b_lease).await?.context("B's lease")?;
    ensure!(
        !String::from_utf8_lossy(&b_state.0).contains("\"epoch\":99"),
        "B's lease changed"
    );

    // An oversized document planted in A's own folder stops only A's job: B's next job runs.
    let a_index = format!("{prefix}/v1/jobs/{a_ns}/work/{}/index", leases[a_ns]);
    raw_s3(&bucket, &a)?
        .put(
            &object_store::path::Path::from(a_index.as_str()),
            vec![b' '; 2 << 20].into(),
        )
        .await
        .context("A plants 2 MiB at its own index")?;
    // A change to the object makes the controller look at it again.
    coordinated_jobs(&ctx.client, a_ns)
        .patch(
            "work",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e/poke": "1"}}})),
        )
        .await?;
    wait_for(
        "A's job to report the oversized index",
        Duration::from_secs(60),
        || async {
            let status = job_status(ctx, a_ns, "work").await?;
            let ready = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .cloned()
                .unwrap_or(Value::Null);
            Ok((ready["reason"] == "InvalidStoreDocument").then_some(()))
        },
    )
    .await?;
    create_job(ctx, b_ns, "after", spec("echo after", json!({}))).await?;
    let after_uid = job_uid(ctx, b_ns, "after").await?;
    let after = terminal_once_lease(
        ctx,
        b_ns,
        "after",
        &after_uid,
        "B's job after A's oversized document",
        Duration::from_secs(90),
    )
    .await?;
    ensure!(
        after.status() == Some("succeeded"),
        "B's job after A planted an oversized document: {}",
        after.state
    );

    // Only those who may create pods may create CoordinatedJobs.
    let cj_only = service_account(
        ctx,
        a_ns,
        "cj-only",
        &[("cojob.dev", "coordinatedjobs", "create")],
    )
    .await?;
    let refused = coordinated_jobs(&cj_only, a_ns)
        .create(
            &PostParams::default(),
            &coordinated_job("sneaky", spec("id", json!({}))),
        )
        .await;
    match &refused {
        Err(kube::Error::Api(s))
            if s.code == 403 && s.message.contains("may not create pods in namespace") => {}
        other => bail!("a requester without pod rights created a CoordinatedJob: {other:?}"),
    }
    let with_pods = service_account(
        ctx,
        a_ns,
        "cj-and-pods",
        &[
            ("cojob.dev", "coordinatedjobs", "create"),
            ("", "pods", "create"),
        ],
    )
    .await?;
    let mut allowed = spec("true", json!({}));
    allowed["suspend"] = json!(true);
    allowed["schedule"] = json!("0 0 1 1 *");
    coordinated_jobs(&with_pods, a_ns)
        .create(&PostParams::default(), &coordinated_job("allowed", allowed))
        .await
        .context("a requester that may create pods is admitted")?;

    // The controller's account: no Secret reads anywhere, and no Secret but a holder Secret.
    let controller =
        impersonating(&format!("system:serviceaccount:{RELEASE_NS}:{RELEASE}")).await?;
    let read = Api::<Secret>::namespaced(controller.clone(), a_ns)
        .get(cojob_e2e::STORE_CREDENTIALS_SECRET)
        .await;
    ensure!(
        matches!(&read, Err(kube::Error::Api(s)) if s.code == 403),
        "the controller's account read a tenant's Secret: {:?}",
        read.map(|s| s.metadata.name)
    );
    let listed = Api::<Secret>::namespaced(controller.clone(), "kube-system")
        .list(&ListParams::default())
        .await;
    ensure!(
        matches!(&listed, Err(kube::Error::Api(s)) if s.code == 403),
        "the controller's account listed kube-system's Secrets"
    );
    for (name, secret) in [
        (
            "plain",
            json!({"metadata": {"name": "plain"}, "type": "Opaque"}),
        ),
        (
            "token",
            json!({"metadata": {"name": "token", "labels": {"cojob.dev/run": "x"},
                "annotations": {"kubernetes.io/service-account.name": "default"}},
                "type": "kubernetes.io/service-account-token"}),
        ),
    ] {
        let created = Api::<Secret>::namespaced(controller.clone(), a_ns)
            .create(&PostParams::default(), &serde_json::from_value(secret)?)
            .await;
        match &created {
            Err(kube::Error::Api(s))
                if s.code == 403 && s.message.contains("creates only the holder Secrets") => {}
            other => bail!("the controller's account created the Secret {name}: {other:?}"),
        }
    }

    // The default `view` role reads CoordinatedJobs and cannot create them.
    let viewer = service_account(ctx, a_ns, "viewer", &[]).await?;
    bind_cluster_role(ctx, a_ns, "viewer", "view").await?;
    let seen = wait_for(
        "view to list CoordinatedJobs",
        Duration::from_secs(10),
        || {
            let viewer = viewer.clone();
            async move {
                Ok(coordinated_jobs(&viewer, a_ns)
                    .list(&ListParams::default())
                    .await
                    .ok()
                    .map(|l| l.items.len()))
            }
        },
    )
    .await?;
    ensure!(seen >= 2, "view listed {seen} CoordinatedJobs");
    let denied = coordinated_jobs(&viewer, a_ns)
        .create(
            &PostParams::default(),
            &coordinated_job("by-viewer", spec("true", json!({}))),
        )
        .await;
    ensure!(
        matches!(&denied, Err(kube::Error::Api(s)) if s.code == 403),
        "view created a CoordinatedJob: {denied:?}"
    );
    println!(
        "k: ok: jobs ran with namespace-scoped S3 users; A could not read or write B's folder, \
         read no controller credential, stopped only its own job with an oversized document, \
         needed pod rights to create a CoordinatedJob; the controller's account read no Secret \
         and could not create a foreign one"
    );
    Ok(())
}

/// The same test as the controller's `looks_secret` (`controller/src/cli.rs`), so the check
/// does not trust the code it checks for its list of words.
fn cojob_controller_looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "KEY",
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "CREDENTIAL",
        "SAS",
        "CONNECTION_STRING",
    ]
    .iter()
    .any(|w| upper.contains(w))
}

/// `s3://bucket/prefix` → (`bucket`, `prefix`).
fn bucket_and_prefix(url: &str) -> anyhow::Result<(String, String)> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| anyhow!("not an s3:// URL: {url}"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    Ok((bucket.into(), prefix.trim_matches('/').into()))
}

/// Creates an S3 user of the test server for `namespace` (versitygw's internal IAM).
async fn tenant(namespace: &str) -> anyhow::Result<Tenant> {
    let t = Tenant {
        namespace: namespace.into(),
        access: format!("tenant-{}", random_suffix(10)),
        secret: random_suffix(32),
    };
    run_tool(
        &required_env("COJOB_VERSITYGW"),
        &[
            "admin",
            "-a",
            &required_env("AWS_ACCESS_KEY_ID"),
            "-s",
            &required_env("AWS_SECRET_ACCESS_KEY"),
            "--er",
            &required_env("AWS_ENDPOINT_URL"),
            "create-user",
            "-a",
            &t.access,
            "-s",
            &t.secret,
            "-r",
            "user",
        ],
    )
    .await
    .context("versitygw admin create-user")?;
    Ok(t)
}

/// Allows each tenant only `<prefix>/v1/jobs/<its namespace>/*` (read and write), as the bucket
/// policy in docs/security.md does. The root account is not bound by it.
async fn put_bucket_policy(bucket: &str, prefix: &str, tenants: &[&Tenant]) -> anyhow::Result<()> {
    let statements: Vec<Value> = tenants
        .iter()
        .map(|t| {
            json!({
                "Effect": "Allow",
                "Principal": {"AWS": [t.access]},
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": [format!("arn:aws:s3:::{bucket}/{prefix}/v1/jobs/{}/*", t.namespace)],
            })
        })
        .collect();
    let policy = json!({"Version": "2012-10-17", "Statement": statements}).to_string();
    let endpoint = required_env("AWS_ENDPOINT_URL");
    let user = format!(
        "{}:{}",
        required_env("AWS_ACCESS_KEY_ID"),
        required_env("AWS_SECRET_ACCESS_KEY")
    );
    let url = format!("{}/{bucket}?policy=", endpoint.trim_end_matches('/'));
    let out = run_tool(
        "curl",
        &[
            "-sS",
            "--fail-with-body",
            "--aws-sigv4",
            "aws:amz:us-east-1:s3",
            "--user",
            &user,
            "-H",
            "x-amz-content-sha256: UNSIGNED-PAYLOAD",
            "-X",
            "PUT",
            "--data-binary",
            &policy,
            &url,
        ],
    )
    .await
    .context("PutBucketPolicy")?;
    let _ = out;
    Ok(())
}

/// Replaces the namespace's store credentials Secret with the tenant's own.
async fn give_credentials(ctx: &Ctx, t: &Tenant) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &t.namespace);
    let _ = secrets
        .delete(
            cojob_e2e::STORE_CREDENTIALS_SECRET,
            &DeleteParams::default(),
        )
        .await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": cojob_e2e::STORE_CREDENTIALS_SECRET},
        "stringData": {"AWS_ACCESS_KEY_ID": t.access, "AWS_SECRET_ACCESS_KEY": t.secret},
    }))?;
    wait_for(
        "the tenant's credentials Secret",
        Duration::from_secs(10),
        || {
            let (secrets, secret) = (secrets.clone(), secret.clone());
            async move { Ok(secrets.create(&PostParams::default(), &secret).await.ok()) }
        },
    )
    .await?;
    Ok(())
}

/// The bucket as a tenant's credentials reach it, without cojob's checks.
fn raw_s3(bucket: &str, t: &Tenant) -> anyhow::Result<object_store::aws::AmazonS3> {
    Ok(object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_endpoint(required_env("AWS_ENDPOINT_URL"))
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id(&t.access)
        .with_secret_access_key(&t.secret)
        .build()?)
}

/// The store as a tenant sees it, with the tenant's credentials.
fn scoped_store(bucket: &str, prefix: &str, t: &Tenant) -> anyhow::Result<cojob::Store> {
    Ok(cojob::Store::new(
        ObjectStoreBackend::new(Arc::new(raw_s3(bucket, t)?)),
        prefix,
    ))
}

/// A client that acts as `user` (impersonation by the test's admin credentials).
async fn impersonating(user: &str) -> anyhow::Result<Client> {
    let mut config = kube::Config::infer().await?;
    config.auth_info.impersonate = Some(user.into());
    Ok(Client::try_from(config)?)
}

/// A ServiceAccount of `ns` with a Role granting `rules` (`(group, resource, verb)`), and a
/// client that acts as it.
async fn service_account(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    rules: &[(&str, &str, &str)],
) -> anyhow::Result<Client> {
    Api::<ServiceAccount>::namespaced(ctx.client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    if !rules.is_empty() {
        let rules: Vec<Value> = rules
            .iter()
            .map(|(g, r, v)| json!({"apiGroups": [g], "resources": [r], "verbs": [v]}))
            .collect();
        Api::<Role>::namespaced(ctx.client.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules}))?,
            )
            .await?;
        Api::<RoleBinding>::namespaced(ctx.client.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
                }))?,
            )
            .await?;
    }
    impersonating(&format!("system:serviceaccount:{ns}:{name}")).await
}

/// Binds the ServiceAccount `name` of `ns` to the ClusterRole `role` in `ns`.
async fn bind_cluster_role(ctx: &Ctx, ns: &str, name: &str, role: &str) -> anyhow::Result<()> {
    Api::<RoleBinding>::namespaced(ctx.client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-{role}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            }))?,
        )
        .await?;
    Ok(())
}
