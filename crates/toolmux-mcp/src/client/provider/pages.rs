//! Reading a paginated listing (`tools/list`, `prompts/list`, `resources/list`,
//! `resources/templates/list`) page by page, with an end even when the server gives none.
//!
//! rmcp's `list_all_*` follow `nextCursor` for as long as the server gives one: a server
//! whose cursor repeats was asked for the same page over and over until the request
//! timeout (82,814 requests and 316 MB in one minute). Here a listing stops at a cursor
//! given before or past [`MAX_PAGES`] pages, keeps what it read and warns.

use rmcp::model::PaginatedRequestParams;
use rmcp::service::ServiceError;
use std::future::Future;

/// Most pages one listing reads.
pub(super) const MAX_PAGES: usize = 1_000;

/// Every item of a listing, its pages asked for by `page` (given the cursor, `None` for
/// the first); a listing cut short is what was read, with a warning naming `server` and
/// `method`.
pub(super) async fn all_pages<T, F, Fut>(
    server: &str,
    method: &str,
    mut page: F,
) -> Result<Vec<T>, ServiceError>
where
    F: FnMut(Option<PaginatedRequestParams>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), ServiceError>>,
{
    let mut items = Vec::new();
    let mut seen = foldhash::HashSet::default();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = cursor.take().map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let (listed, next) = page(params).await?;
        items.extend(listed);
        let Some(next) = next else { return Ok(items) };
        if !seen.insert(next.clone()) {
            let shown = &next[..next.floor_char_boundary(60)];
            tracing::warn!(
                server,
                "{method}: the list is cut: the server gave the cursor `{shown}` a second \
                 time; keeping the {} items of the {} pages read",
                items.len(),
                seen.len() + 1
            );
            return Ok(items);
        }
        cursor = Some(next);
    }
    tracing::warn!(
        server,
        "{method}: the list is cut: the server still gave a next cursor after {MAX_PAGES} \
         pages; keeping the {} items of the {MAX_PAGES} pages read",
        items.len()
    );
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmux_test_support::logs::captured_logs;

    /// What a listing of `next` cursors (one item a page) keeps and warns.
    fn check(next: impl Fn(usize) -> Option<String>, expect: expect_test::Expect) {
        let (items, said) = captured_logs(|| {
            let pages = std::cell::Cell::new(0);
            let listing = all_pages("srv", "tools/list", |_| {
                pages.set(pages.get() + 1);
                std::future::ready(Ok((vec![pages.get()], next(pages.get()))))
            });
            futures::executor::block_on(listing).unwrap()
        });
        expect.assert_eq(&format!("{} items\n{}", items.len(), said.join("\n")));
    }

    #[test]
    fn a_cut_listing_says_so() {
        check(
            |_| Some("same".to_owned()),
            expect_test::expect![[r#"
                2 items
                WARN message=tools/list: the list is cut: the server gave the cursor `same` a second time; keeping the 2 items of the 2 pages read server="srv""#]],
        );
        check(
            |page| Some(format!("c{page}")),
            expect_test::expect![[r#"
            1000 items
            WARN message=tools/list: the list is cut: the server still gave a next cursor after 1000 pages; keeping the 1000 items of the 1000 pages read server="srv""#]],
        );
        check(
            |page| (page < 3).then(|| format!("c{page}")),
            expect_test::expect![[r#"
            3 items
        "#]],
        );
    }
}
