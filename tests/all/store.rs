//! The store conformance suite (`toolgate_tests::conformance`) against every
//! store this build has. A new backend is done when this suite passes on it.

mod sqlite_file {
    toolgate_tests::conformance_suite!(toolgate_tests::conformance::SqliteFile);
}

mod sqlite_memory {
    toolgate_tests::conformance_suite!(toolgate_tests::conformance::SqliteMemory);
}
