//! The controller's requests to the Kubernetes API server, counted by verb, resource and
//! status: a [`tower`] layer on the client ([`KubeRequests::layer`]), exported by
//! [`Metrics`](crate::metrics::Metrics) as `cojob_kube_requests_total`.
//!
//! The API server's own metrics cannot say which client sent what (its per-request counters
//! carry no user), and its priority-and-fairness counters carry no verb; this counter answers
//! "what does a run cost the API server" from the controller's side. Verbs and resources are
//! named as the API server's audit log and RBAC name them (`create`, `list`, `watch`,
//! `pods/status`), so a figure reads against a Role's rules directly.
//!
//! ```
//! use cojob_controller::kube_requests::{KubeRequests, classify};
//! let (verb, resource) = classify(&http::Method::GET, "/api/v1/namespaces/team-a/pods", Some("watch=true"));
//! assert_eq!((verb, resource.as_str()), ("watch", "pods"));
//! let (verb, resource) = classify(&http::Method::PATCH, "/apis/cojob.dev/v1alpha1/namespaces/team-a/coordinatedjobs/nightly/status", None);
//! assert_eq!((verb, resource.as_str()), ("patch", "coordinatedjobs/status"));
//! let counted = KubeRequests::default();
//! counted.count("create", "pods", "201");
//! assert_eq!(counted.get("create", "pods", "201"), 1);
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// The labels of one series: verb, resource, status.
type Series = (&'static str, String, String);

/// Requests sent to the API server, by verb, resource and HTTP status (`error` when no status
/// came back). Cheap to clone: every clone counts into the same series.
#[derive(Debug, Clone, Default)]
pub struct KubeRequests {
    counts: Arc<Mutex<BTreeMap<Series, u64>>>,
}

impl KubeRequests {
    /// Counts one request.
    pub fn count(&self, verb: &'static str, resource: &str, code: &str) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts
            .entry((verb, resource.to_string(), code.to_string()))
            .or_default() += 1;
    }

    /// How many requests were counted with these labels.
    pub fn get(&self, verb: &'static str, resource: &str, code: &str) -> u64 {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .get(&(verb, resource.to_string(), code.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Every series counted so far, as `(verb, resource, code, count)`, sorted.
    pub fn snapshot(&self) -> Vec<(&'static str, String, String, u64)> {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .iter()
            .map(|((v, r, c), n)| (*v, r.clone(), c.clone(), *n))
            .collect()
    }

    /// A layer for [`kube::client::ClientBuilder::with_layer`] that counts every request its
    /// client sends, once its status (or its failure) is known. A watch counts once, when its
    /// stream opens.
    pub fn layer(&self) -> CountLayer {
        CountLayer {
            counts: self.clone(),
        }
    }
}

impl Collector for KubeRequests {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counter = ConstCounter::new(0u64);
        let mut metric = encoder.encode_descriptor(
            "cojob_kube_requests",
            "Requests this process sent to the Kubernetes API server, by verb, resource (with \
             its subresource) and HTTP status (error: no status came back)",
            None,
            counter.metric_type(),
        )?;
        for (verb, resource, code, n) in self.snapshot() {
            let labels = [
                ("verb", verb),
                ("resource", resource.as_str()),
                ("code", code.as_str()),
            ];
            ConstCounter::new(n).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The verb and resource of a request to the API server, as its audit log names them:
/// `get`, `list` or `watch` for a GET (by whether it names an object, and its `watch`
/// parameter), `create`, `update`, `patch`, `delete` or `deletecollection` for the others, and
/// the resource with its subresource (`pods/status`, `pods/eviction`). A path outside
/// `/api` and `/apis` (`/version`) is resource `nonresource`.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.first() {
        Some(&"api") if parts.len() > 2 => &parts[2..],
        Some(&"apis") if parts.len() > 3 => &parts[3..],
        _ => return (verb_of(method, false, query), "nonresource".into()),
    };
    // A namespace's own subresources (`namespaces/x/status`) are the namespace's; anything
    // else under `namespaces/x/` is a namespaced resource.
    let rest = match rest {
        ["namespaces", _, third, ..] if !matches!(*third, "status" | "finalize") => &rest[2..],
        _ => rest,
    };
    let resource = match rest {
        [resource, _name, sub, ..] => format!("{resource}/{sub}"),
        [resource, ..] => (*resource).to_string(),
        [] => "nonresource".to_string(),
    };
    (verb_of(method, rest.len() >= 2, query), resource)
}

fn verb_of(method: &Method, named: bool, query: Option<&str>) -> &'static str {
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "watch")
    });
    match *method {
        Method::GET if named => "get",
        Method::GET if watching => "watch",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

/// The layer of [`KubeRequests::layer`].
#[derive(Debug, Clone)]
pub struct CountLayer {
    counts: KubeRequests,
}

impl<S> tower::Layer<S> for CountLayer {
    type Service = CountService<S>;

    fn layer(&self, inner: S) -> CountService<S> {
        CountService {
            inner,
            counts: self.counts.clone(),
        }
    }
}

/// The service of [`CountLayer`].
#[derive(Debug, Clone)]
pub struct CountService<S> {
    inner: S,
    counts: KubeRequests,
}

impl<S, B, R> tower::Service<Request<B>> for CountService<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (verb, resource) = classify(req.method(), req.uri().path(), req.uri().query());
        let counts = self.counts.clone();
        let sent = self.inner.call(req);
        Box::pin(async move {
            let result = sent.await;
            let code = match &result {
                Ok(response) => response.status().as_str().to_string(),
                Err(_) => "error".to_string(),
            };
            counts.count(verb, &resource, &code);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: Method, path: &str, query: Option<&str>) -> (&'static str, String) {
        classify(&method, path, query)
    }

    #[test]
    fn requests_are_named_as_the_api_server_names_them() {
        let ns = "/api/v1/namespaces/a";
        assert_eq!(
            c(Method::GET, &format!("{ns}/pods/p"), None),
            ("get", "pods".into())
        );
        assert_eq!(
            c(Method::GET, &format!("{ns}/pods"), Some("labelSelector=x")),
            ("list", "pods".into())
        );
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/pods",
                Some("resourceVersion=0&watch=true&timeoutSeconds=290")
            ),
            ("watch", "pods".into())
        );
        assert_eq!(
            c(Method::POST, &format!("{ns}/secrets"), None),
            ("create", "secrets".into())
        );
        assert_eq!(
            c(Method::DELETE, &format!("{ns}/secrets/s"), None),
            ("delete", "secrets".into())
        );
        assert_eq!(
            c(Method::DELETE, &format!("{ns}/pods"), None),
            ("deletecollection", "pods".into())
        );
        assert_eq!(
            c(Method::PATCH, &format!("{ns}/pods/p/status"), None),
            ("patch", "pods/status".into())
        );
        assert_eq!(
            c(Method::PUT, &format!("{ns}/pods/p"), None),
            ("update", "pods".into())
        );
        assert_eq!(
            c(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/a/events",
                None
            ),
            ("create", "events".into())
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/cojob.dev/v1alpha1/namespaces/a/coordinatedjobs/j/status",
                None
            ),
            ("patch", "coordinatedjobs/status".into())
        );
        assert_eq!(
            c(
                Method::GET,
                "/apis/cojob.dev/v1alpha1/coordinatedjobs",
                Some("watch=1")
            ),
            ("watch", "coordinatedjobs".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/a", None),
            ("get", "namespaces".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces", None),
            ("list", "namespaces".into())
        );
        assert_eq!(
            c(Method::PUT, "/api/v1/namespaces/a/finalize", None),
            ("update", "namespaces/finalize".into())
        );
        assert_eq!(
            c(Method::GET, "/version", None),
            ("list", "nonresource".into())
        );
        assert_eq!(
            c(Method::GET, "/apis", None),
            ("list", "nonresource".into())
        );
        assert_eq!(
            c(Method::OPTIONS, &format!("{ns}/pods"), None),
            ("other", "pods".into())
        );
    }

    #[test]
    fn a_snapshot_reads_back_every_series() {
        let counts = KubeRequests::default();
        counts.count("create", "pods", "201");
        counts.count("create", "pods", "201");
        counts.count("patch", "coordinatedjobs/status", "409");
        counts.count("get", "pods", "error");
        assert_eq!(
            counts.snapshot(),
            vec![
                ("create", "pods".to_string(), "201".to_string(), 2),
                ("get", "pods".into(), "error".into(), 1),
                ("patch", "coordinatedjobs/status".into(), "409".into(), 1),
            ]
        );
        assert_eq!(counts.get("patch", "coordinatedjobs/status", "409"), 1);
        assert_eq!(counts.get("patch", "coordinatedjobs/status", "200"), 0);
    }

    #[tokio::test]
    async fn the_layer_counts_a_request_once_its_status_is_known() {
        use tower::{Layer, ServiceExt};
        let counts = KubeRequests::default();
        let inner = tower::service_fn(|req: Request<()>| async move {
            let status = if req.method() == Method::POST {
                409
            } else {
                200
            };
            Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap())
        });
        let svc = counts.layer().layer(inner);
        let req = |m: Method, uri: &str| Request::builder().method(m).uri(uri).body(()).unwrap();
        svc.clone()
            .oneshot(req(Method::POST, "/api/v1/namespaces/a/pods"))
            .await
            .unwrap();
        svc.oneshot(req(Method::GET, "/api/v1/namespaces/a/pods/p"))
            .await
            .unwrap();
        assert_eq!(counts.get("create", "pods", "409"), 1);
        assert_eq!(counts.get("get", "pods", "200"), 1);
        assert_eq!(counts.snapshot().len(), 2);
    }
}
