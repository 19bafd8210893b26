//! One engine process per SQLite file: the engine's `flock` is on the
//! database file itself, so another spelling of the path, a symlink or a
//! hard link to the file finds it taken, and closing the store frees it.

use belay_engine::store::{Store, StoreError};

fn dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("belay_lock_{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

async fn refused(url: &str) {
    match Store::connect(url, 2).await {
        Err(StoreError::Config(m)) => assert!(m.contains("in use by another engine"), "{m}"),
        Err(other) => panic!("{url}: expected a refusal, got {other}"),
        Ok(_) => panic!("{url}: a second store opened the same file"),
    }
}

#[tokio::test]
async fn a_second_store_is_refused_by_any_path_to_the_file_until_the_first_closes() {
    let dir = dir();
    let file = dir.join("belay.db");
    let store = Store::connect(&format!("sqlite://{}", file.display()), 2)
        .await
        .expect("first store");
    store.migrate().await.expect("migrate");

    refused(&format!("sqlite://{}", file.display())).await;
    refused(&format!("sqlite://{}/./belay.db", dir.display())).await;
    let symlink = dir.join("symlink.db");
    std::os::unix::fs::symlink(&file, &symlink).expect("symlink");
    refused(&format!("sqlite://{}", symlink.display())).await;
    let hard = dir.join("hard.db");
    std::fs::hard_link(&file, &hard).expect("hard link");
    refused(&format!("sqlite://{}", hard.display())).await;

    store.close().await;
    let again = Store::connect(&format!("sqlite://{}", symlink.display()), 2)
        .await
        .expect("the file is free once the first store is closed");
    again.migrate().await.expect("migrations already applied");
    again.close().await;
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
