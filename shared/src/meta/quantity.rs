//! Kubernetes' `resource.Quantity` as the API server parses it (the amounts the controllers
//! compute with, e.g. node CPU for topology hints).
