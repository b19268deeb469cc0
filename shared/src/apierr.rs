//! Classifying API errors the way client-go's `apierrors` helpers do.

pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
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
