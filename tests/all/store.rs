//! The store conformance suite (`toolgate_tests::conformance`) against every
//! store this build has. A new backend is done when this suite passes on it.

mod sqlite_file {
    toolgate_tests::conformance_suite!(toolgate_tests::conformance::SqliteFile);
}

mod sqlite_memory {
    toolgate_tests::conformance_suite!(toolgate_tests::conformance::SqliteMemory);
}

/// Against the PostgreSQL server `TOOLGATE_TEST_PG` names (`scripts/test`
/// starts one); skipped, saying so, without it.
mod postgres {
    use toolgate::store::CommitError;
    use toolgate::store::postgres::{PostgresJournal, SCHEMA_VERSION};
    use toolgate_tests::conformance::{Backend, Postgres};

    toolgate_tests::conformance_suite!(toolgate_tests::conformance::Postgres);

    /// Hosts starting together on an empty database: the advisory lock lets
    /// one migrate, the others find the schema done; all of them work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hosts_starting_together_migrate_once() {
        if !Postgres.available() {
            return;
        }
        let j = Postgres.create().await;
        let locator = j.locator.clone().unwrap();
        drop(j.store);
        // `create` migrated it: empty the database again, then start six hosts at once.
        let (client, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.batch_execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;").await.unwrap();
        let opens: Vec<_> = (0..6)
            .map(|_| {
                let l = locator.clone();
                tokio::spawn(async move { PostgresJournal::connect(&l, None, 2).await })
            })
            .collect();
        for o in opens {
            o.await.unwrap().expect("every host starting together opens the journal");
        }
        let versions = client.query("SELECT version FROM toolgate_schema", &[]).await.unwrap();
        assert_eq!(versions.len(), 1, "one version row");
        assert_eq!(versions[0].get::<_, i64>(0), SCHEMA_VERSION);
        drop(j.keep);
    }

    /// A journal from a newer toolgate is refused, naming the versions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_newer_schema_is_refused() {
        if !Postgres.available() {
            return;
        }
        let j = Postgres.create().await;
        let locator = j.locator.clone().unwrap();
        let (client, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.execute("UPDATE toolgate_schema SET version = version + 1", &[]).await.unwrap();
        match PostgresJournal::connect(&locator, None, 2).await {
            Err(CommitError::NewerSchema { found, known, .. }) => {
                assert_eq!((found, known), (SCHEMA_VERSION + 1, SCHEMA_VERSION))
            }
            Err(e) => panic!("expected NewerSchema, got {e}"),
            Ok(_) => panic!("a newer schema must be refused"),
        }
    }

    /// A failed connection names the database, never the password.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn errors_never_show_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let dsn = format!("host={} user=nobody dbname=absent connect_timeout=2", dir.path().display());
        let e = match PostgresJournal::connect(&dsn, Some("pw-SECRET-4711"), 1).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("nothing listens there"),
        };
        assert!(e.contains("absent") && e.contains("nobody"), "names the database and user: {e}");
        assert!(!e.contains("pw-SECRET-4711"), "{e}");
    }
}
