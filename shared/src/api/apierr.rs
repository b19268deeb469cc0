//! Classifying API errors the way client-go's `apierrors` helpers do.

pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// client-go's `IsConflict`: reason Conflict (a stale resourceVersion, a failed precondition),
/// not AlreadyExists, which shares the 409.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason != "AlreadyExists")
}

/// A patch that carried `metadata.uid` met another object of the same name: the API server
/// rejects the changed UID as an immutable field (422 Invalid on metadata.uid), not with 409.
pub fn is_uid_mismatch(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422 && s.message.contains("metadata.uid"))
}

pub fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
}

/// The namespace is being deleted: creating more objects in it is pointless and not an error.
pub fn is_namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403 && s.message.contains("because it is being terminated"))
}

/// A short label for metrics: the HTTP code, or the kind of client-side failure.
pub fn error_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.code.to_string(),
        kube::Error::Service(_) | kube::Error::HyperError(_) => "transport".into(),
        _ => "client".into(),
    }
}

/// The text Go's `%v` prints for the error: the server's message for API errors.
pub fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// What kind of failure an error is, with one label vocabulary for every metric that counts
/// failures (`pilothouse_reconcile_total{result}`, per-controller failure counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    NotFound,
    Conflict,
    AlreadyExists,
    Invalid,
    Forbidden,
    Unauthorized,
    TooManyRequests,
    Timeout,
    ServerError,
    /// Any other 4xx answer.
    ClientError,
    /// The request never got an answer: connection, TLS, or I/O.
    Transport,
    /// Refused locally: this replica does not (surely) lead.
    NotLeading,
    /// Anything that is not an API failure: decoding, a controller's own refusal.
    Other,
}

impl ErrorKind {
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::TooManyRequests => "too_many_requests",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ServerError => "server_error",
            ErrorKind::ClientError => "client_error",
            ErrorKind::Transport => "transport",
            ErrorKind::NotLeading => "not_leading",
            ErrorKind::Other => "other",
        }
    }
}

/// Classifies an API error (client-go's `apierrors.ReasonForError` and friends).
pub fn classify(e: &kube::Error) -> ErrorKind {
    match e {
        kube::Error::Api(s) => match (s.code, s.reason.as_str()) {
            (409, "AlreadyExists") => ErrorKind::AlreadyExists,
            (409, _) => ErrorKind::Conflict,
            (404, _) => ErrorKind::NotFound,
            (422, _) | (400, "Invalid") => ErrorKind::Invalid,
            (403, _) => ErrorKind::Forbidden,
            (401, _) => ErrorKind::Unauthorized,
            (429, _) => ErrorKind::TooManyRequests,
            (408, _) | (504, _) | (_, "Timeout") => ErrorKind::Timeout,
            (500..=599, _) => ErrorKind::ServerError,
            _ => ErrorKind::ClientError,
        },
        kube::Error::Service(s) if is_not_leading(s.as_ref()) => ErrorKind::NotLeading,
        kube::Error::Service(_) | kube::Error::HyperError(_) => ErrorKind::Transport,
        _ => ErrorKind::Other,
    }
}

/// A write refused before it was sent: this replica does not (or no longer surely) lead.
#[derive(Debug, thiserror::Error)]
#[error("refused {method} {path}: this replica is not (or no longer surely) the leader")]
pub struct NotLeading {
    pub method: http::Method,
    pub path: String,
}

fn is_not_leading(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<NotLeading>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// An API request that failed, with what the sync was doing: the one `Api` variant every
/// controller's error enum wraps (`#[error(transparent)] Api(#[from] Failed)`), so the text and
/// the kind of an API failure are the same in every controller.
///
/// Its text is what Go's `%v` prints: the server's message for an API error, never the Rust
/// debug form of the status (events and logs carry it to operators).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {}", message(source))]
pub struct Failed {
    pub what: String,
    #[source]
    pub source: kube::Error,
}

impl Classify for Failed {
    fn kind(&self) -> ErrorKind {
        self.source.kind()
    }
}

/// For `map_err`: the failure labelled with what the sync was doing, as the controller's error.
pub fn doing<E: From<Failed>>(what: impl Into<String>) -> impl FnOnce(kube::Error) -> E {
    let what = what.into();
    move |source| E::from(Failed { what, source })
}

/// An error that knows its [`ErrorKind`]: every controller's error type implements it, so the
/// runtime labels failed syncs in one vocabulary.
pub trait Classify {
    fn kind(&self) -> ErrorKind;
}

impl Classify for kube::Error {
    fn kind(&self) -> ErrorKind {
        classify(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            ..kube::core::Status::failure("m", reason)
        }))
    }

    #[test]
    fn classifies_api_answers() {
        assert_eq!(
            classify(&api(409, "AlreadyExists")),
            ErrorKind::AlreadyExists
        );
        assert_eq!(classify(&api(409, "Conflict")), ErrorKind::Conflict);
        assert_eq!(classify(&api(404, "NotFound")), ErrorKind::NotFound);
        assert_eq!(classify(&api(422, "Invalid")), ErrorKind::Invalid);
        assert_eq!(
            classify(&api(429, "TooManyRequests")),
            ErrorKind::TooManyRequests
        );
        assert_eq!(classify(&api(500, "InternalError")), ErrorKind::ServerError);
        assert_eq!(classify(&api(504, "Timeout")), ErrorKind::Timeout);
        assert_eq!(classify(&api(418, "")), ErrorKind::ClientError);
        assert!(is_conflict(&api(409, "Conflict")));
        assert!(!is_conflict(&api(409, "AlreadyExists")));
        assert!(is_already_exists(&api(409, "AlreadyExists")));
    }

    #[test]
    fn a_failure_reads_as_go_prints_it() {
        let source = kube::Error::Api(Box::new(kube::core::Status::failure(
            "EndpointSlice.discovery.k8s.io \"web-abc\" is invalid: endpoints[0].addresses: Required value",
            "Invalid",
        )));
        let text = Failed {
            what: "failed to create EndpointSlice for Service ns/web".into(),
            source,
        }
        .to_string();
        assert_eq!(
            text,
            "failed to create EndpointSlice for Service ns/web: EndpointSlice.discovery.k8s.io \"web-abc\" is invalid: endpoints[0].addresses: Required value"
        );
        assert!(!text.contains("Status {"), "{text}");
    }
}
