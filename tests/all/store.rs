//! The store conformance suite (`toolgate_tests::conformance`) against every
//! store this build has. A new backend is done when this suite passes on it.

mod sqlite_file {
    toolgate_tests::conformance_suite!(toolgate_tests::conformance::SqliteFile);
}

mod sqlite_memory {
    toolgate_tests::conformance_suite!(toolgate_tests::conformance::SqliteMemory);
}

/// `store = ":memory:"`.
mod memory {
    toolgate_tests::conformance_suite!(toolgate_tests::conformance::Memory);
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
                tokio::spawn(async move { PostgresJournal::connect(&l, None, 2, None).await })
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
        match PostgresJournal::connect(&locator, None, 2, None).await {
            Err(CommitError::NewerSchema { found, known, .. }) => {
                assert_eq!((found, known), (SCHEMA_VERSION + 1, SCHEMA_VERSION))
            }
            Err(e) => panic!("expected NewerSchema, got {e}"),
            Ok(_) => panic!("a newer schema must be refused"),
        }
    }

    /// Over TCP the connection is TLS, the server's certificate verified:
    /// with the CA the config names it connects encrypted; without it (a
    /// certificate no trusted root signed) it fails — never plain text.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_is_verified_and_never_falls_back_to_plain_text() {
        let (Ok(tls), Ok(ca)) = (std::env::var("TOOLGATE_TEST_PG_TLS"), std::env::var("TOOLGATE_TEST_PG_CA")) else {
            eprintln!("skipped: set TOOLGATE_TEST_PG_TLS and TOOLGATE_TEST_PG_CA (scripts/test does)");
            return;
        };
        let Some((locator, keep)) = Postgres::fresh_database().await else { return };
        let db = locator.rsplit("dbname=").next().unwrap().to_owned();
        let dsn = format!("{tls} dbname={db}");
        match PostgresJournal::connect(&dsn, None, 1, None).await {
            Err(e) => assert!(e.to_string().to_lowercase().contains("certificate"), "names the certificate: {e}"),
            Ok(_) => panic!("a server certificate no trusted root signed must fail the connection"),
        }
        let ca = std::path::PathBuf::from(ca);
        let j = PostgresJournal::connect(&dsn, None, 1, Some(&ca)).await.expect("with the CA it connects");
        let (client, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let rows = client
            .query(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                 WHERE a.application_name = 'toolgate' AND a.datname = $1",
                &[&db],
            )
            .await
            .unwrap();
        assert!(!rows.is_empty() && rows.iter().all(|r| r.get::<_, bool>(0)), "the journal's connections are TLS");
        drop(j);
        drop(keep);
    }

    /// A password inside the connection string is refused in every spelling
    /// the driver parses, and the refusal does not repeat it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_password_in_the_connection_string_is_refused_in_every_spelling() {
        for dsn in [
            "postgres://tg:pw-IN-DSN-77@127.0.0.1:1/db",
            "postgresql://tg@127.0.0.1:1/db?password=pw-IN-DSN-77",
            "postgres://tg:pw%2DIN%2DDSN%2D77@127.0.0.1:1/db",
            "host=127.0.0.1 port=1 user=tg password=pw-IN-DSN-77 dbname=db",
            "host=127.0.0.1 port=1 user=tg password='pw-IN-DSN-77' dbname=db",
        ] {
            let e = match PostgresJournal::connect(dsn, None, 1, None).await {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{dsn}: nothing listens there, and it must be refused before that"),
            };
            assert!(e.contains("carries a password"), "{dsn}: {e}");
            assert!(!e.contains("pw-IN-DSN-77") && !e.contains("DSN%2D77"), "{dsn}: {e}");
        }
    }

    /// A failed connection names the database, never the password.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn errors_never_show_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let dsn = format!("host={} user=nobody dbname=absent connect_timeout=2", dir.path().display());
        let e = match PostgresJournal::connect(&dsn, Some("pw-SECRET-4711"), 1, None).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("nothing listens there"),
        };
        assert!(e.contains("absent") && e.contains("nobody"), "names the database and user: {e}");
        assert!(!e.contains("pw-SECRET-4711"), "{e}");
    }
}
