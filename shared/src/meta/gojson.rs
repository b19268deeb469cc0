//! Go's `encoding/json` output, byte for byte, where upstream hashes or patches what it
//! marshals (a StatefulSet's revision patch).
