//! The operator's command: pilothouse maintenance (helper "cli" owns this file).
