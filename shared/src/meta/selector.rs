//! `metav1.LabelSelector` matching with apimachinery's semantics (`LabelSelectorAsSelector`):
//! a missing selector matches nothing, an empty one everything; `matchLabels` and every
//! `matchExpressions` requirement must hold.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector: {0}")]
pub struct InvalidSelector(pub String);

/// Whether `labels` satisfy `selector`. An unknown operator, or `In`/`NotIn` without values, is
/// an error (the API server rejects such selectors; one read from elsewhere matches nothing).
pub fn matches(
    selector: Option<&LabelSelector>,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<bool, InvalidSelector> {
    let Some(selector) = selector else {
        return Ok(false);
    };
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    for (k, v) in selector.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Ok(false);
        }
    }
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        let have = labels.get(&req.key);
        let ok = match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(InvalidSelector(format!(
                    "{} {} needs values",
                    req.key, req.operator
                )));
            }
            "In" => have.is_some_and(|h| values.contains(h)),
            "NotIn" => have.is_none_or(|h| !values.contains(h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            op => return Err(InvalidSelector(format!("unknown operator {op:?}"))),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn nil_matches_nothing_empty_matches_everything() {
        let l = labels(&[("a", "1")]);
        assert_eq!(matches(None, Some(&l)), Ok(false));
        assert_eq!(matches(Some(&LabelSelector::default()), Some(&l)), Ok(true));
        assert_eq!(matches(Some(&LabelSelector::default()), None), Ok(true));
    }

    #[test]
    fn labels_and_expressions() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        let sel = |ml: &[(&str, &str)], me: Vec<LabelSelectorRequirement>| LabelSelector {
            match_labels: (!ml.is_empty()).then(|| labels(ml)),
            match_expressions: (!me.is_empty()).then_some(me),
        };
        let cases = [
            (sel(&[("a", "1")], vec![]), Ok(true)),
            (sel(&[("a", "2")], vec![]), Ok(false)),
            (sel(&[], vec![req("a", "In", &["0", "1"])]), Ok(true)),
            (sel(&[], vec![req("c", "In", &["1"])]), Ok(false)),
            (sel(&[], vec![req("a", "NotIn", &["1"])]), Ok(false)),
            (sel(&[], vec![req("c", "NotIn", &["1"])]), Ok(true)),
            (sel(&[], vec![req("b", "Exists", &[])]), Ok(true)),
            (sel(&[], vec![req("b", "DoesNotExist", &[])]), Ok(false)),
            (
                sel(&[("a", "1")], vec![req("c", "DoesNotExist", &[])]),
                Ok(true),
            ),
        ];
        for (s, want) in cases {
            assert_eq!(matches(Some(&s), Some(&l)), want, "{s:?}");
        }
        assert!(matches(Some(&sel(&[], vec![req("a", "Gt", &["1"])])), Some(&l)).is_err());
        assert!(matches(Some(&sel(&[], vec![req("a", "In", &[])])), Some(&l)).is_err());
    }
}
