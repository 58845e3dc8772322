//! [`ScratchDb`]: a database of its own for a test, a bench run or a fault run — an SQLite file in
//! a temp dir, or a fresh PostgreSQL database that is dropped again when the run is done (or, at
//! the latest, when the value is dropped). The one place such databases are made and removed.

use anyhow::Context;

/// The local PostgreSQL the tests, the bench and the fault runner use by default (trust auth).
pub const POSTGRES_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub struct ScratchDb {
    pub url: String,
    postgres: Option<Postgres>,
    _dir: Option<tempfile::TempDir>,
}

/// Where a scratch PostgreSQL database lives, to drop it.
struct Postgres {
    admin_url: String,
    name: String,
}

impl ScratchDb {
    /// An SQLite file `file_name` in a temp dir of its own.
    pub fn sqlite(file_name: &str) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("seatrush-").tempdir()?;
        let url = format!("sqlite://{}", dir.path().join(file_name).display());
        Ok(Self { url, postgres: None, _dir: Some(dir) })
    }

    /// A fresh database `{prefix}_{uuid}` on the server of `admin_url`.
    pub async fn postgres(admin_url: &str, prefix: &str) -> anyhow::Result<Self> {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(admin_url)
            .await
            .with_context(|| format!("connecting to PostgreSQL at {admin_url}"))?;
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await?;
        admin.close().await;
        let base = admin_url.rsplit_once('/').map_or(admin_url, |(base, _)| base);
        Ok(Self {
            url: format!("{base}/{name}"),
            postgres: Some(Postgres { admin_url: admin_url.to_owned(), name }),
            _dir: None,
        })
    }

    /// The PostgreSQL database's name (None for SQLite).
    pub fn postgres_name(&self) -> Option<&str> {
        self.postgres.as_ref().map(|p| p.name.as_str())
    }

    /// Drops the PostgreSQL database now (whoever is still connected); nothing for SQLite, whose
    /// temp dir goes with the value.
    pub async fn drop_now(&mut self) {
        if let Some(pg) = self.postgres.take() {
            pg.drop_database().await;
        }
    }
}

impl Postgres {
    async fn drop_database(&self) {
        let Ok(admin) = sqlx::PgPool::connect(&self.admin_url).await else { return };
        let name = &self.name;
        // A database-down fault may have left it refusing connections; DROP needs none of them.
        let _ = sqlx::query(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).execute(&admin).await;
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&admin).await;
        admin.close().await;
    }
}

impl Drop for ScratchDb {
    /// A database not dropped with [`ScratchDb::drop_now`] is dropped here, on a thread of its
    /// own (a `Drop` cannot await, and may run inside a runtime that must not block).
    fn drop(&mut self) {
        let Some(pg) = self.postgres.take() else { return };
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                runtime.block_on(pg.drop_database());
            }
        })
        .join();
    }
}
