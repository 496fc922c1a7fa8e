select
    c.customer_id,
    c.first_name,
    c.last_name,
    min(o.order_date) as first_order,
    count(o.order_id) as number_of_orders,
    coalesce(sum(o.amount), 0) as lifetime_value
from {{ ref('stg_customers') }} as c
left join {{ ref('orders') }} as o using (customer_id)
group by 1, 2, 3
